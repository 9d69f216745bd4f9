"""``/health/live`` and ``/health/ready`` with every dependency up, and with each one stopped in turn."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import update

from api.models import TaskOutbox, WorkflowRun
from api.models.engine import db
from harness.postgres_server import PostgresServer, postgres_available
from harness.processes import ROOT, Worker, running_worker
from harness.redis_server import RedisServer
from harness.waiting import wait_until
from tests.app.conftest import AppHarness
from tests.app.test_service_api import slow_greeting

pytestmark = pytest.mark.timeout(120)


def ready(harness: AppHarness) -> tuple[int, dict[str, object], float]:
    began = time.monotonic()
    response = harness.client.get("/health/ready")
    return response.status_code, response.json, time.monotonic() - began


def within_deadline(harness: AppHarness, took: float) -> bool:
    """The probe answered within its checks' deadline (``HEALTH_CHECK_TIMEOUT``), with as long again for
    a loaded machine."""
    return took < 2 * harness.app.config["APP_CONFIG"].HEALTH_CHECK_TIMEOUT


def test_live_and_ready_with_everything_up(harness: AppHarness) -> None:
    live = harness.client.get("/health/live")
    assert live.status_code == 200 and live.json == {"status": "ok"}
    status, body, _ = ready(harness)
    assert status == 200 and body["checks"] == {"database": "ok", "stream_store": "ok", "broker": "ok", "workers": "ok"}


def test_ready_names_a_stopped_stream_store(make_harness: Callable[..., AppHarness]) -> None:
    with RedisServer() as store:
        harness = make_harness(start_worker=False, DURABLE_STREAM_URL=f"{store.url}?key_prefix=health:")
        assert ready(harness)[0] == 200
        store.kill()
        status, body, took = ready(harness)
    assert status == 503 and body["code"] == "not_ready" and within_deadline(harness, took)
    assert body["checks"] == {"database": "ok", "stream_store": "unavailable", "broker": "ok", "workers": "ok"}
    assert "stream_store" in str(body["message"])


def test_ready_names_a_stopped_broker(make_harness: Callable[..., AppHarness]) -> None:
    with RedisServer() as broker:
        harness = make_harness(start_worker=False, CELERY_BROKER_URL=broker.url)
        assert ready(harness)[0] == 200
        broker.kill()
        status, body, took = ready(harness)
    assert status == 503 and body["checks"]["broker"] in ("unavailable", "timeout") and within_deadline(harness, took)
    assert body["checks"]["database"] == "ok" and body["checks"]["stream_store"] == "ok"


@pytest.mark.skipif(not postgres_available(), reason="PostgreSQL binaries are not installed")
def test_ready_names_a_stopped_database(make_harness: Callable[..., AppHarness]) -> None:
    with PostgresServer() as database:
        harness = make_harness(
            start_worker=False, SQLALCHEMY_DATABASE_URI=database.url.replace("postgresql:", "postgresql+psycopg:")
        )
        assert ready(harness)[0] == 200
        database.stop()
        status, body, took = ready(harness)
    assert status == 503 and body["checks"]["database"] in ("unavailable", "timeout") and within_deadline(harness, took)
    assert (
        body["checks"]["stream_store"] == "ok" and int(harness.client.get("/health/ready").headers["Retry-After"]) > 0
    )


@contextlib.contextmanager
def hung(server: RedisServer) -> Iterator[None]:
    """The server accepts connections (the kernel does) and never answers: SIGSTOP."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


def test_ready_answers_within_its_deadline_however_many_dependencies_hang(
    make_harness: Callable[..., AppHarness],
) -> None:
    timeout = 2.0
    with RedisServer() as store, RedisServer() as broker:
        harness = make_harness(
            start_worker=False,
            HEALTH_CHECK_TIMEOUT=timeout,
            DURABLE_STREAM_URL=f"{store.url}?key_prefix=health:",
            CELERY_BROKER_URL=broker.url,
        )
        assert ready(harness)[0] == 200
        with hung(store), hung(broker):
            status, body, took = ready(harness)
            # Asked one after the other, two hung checks took twice the deadline; at once, one deadline.
            assert status == 503 and took < 1.5 * timeout, took
            assert body["checks"] == {"database": "ok", "stream_store": "timeout", "broker": "timeout", "workers": "ok"}
            status, body, took = ready(harness)  # the hung checks still run: not asked again, answered at once
            assert status == 503 and took < timeout / 2 and body["checks"]["broker"] == "timeout", (took, body)
        wait_until(lambda: ready(harness)[0] == 200, 30, "the servers to answer again and ready to say so")


def test_the_filesystem_brokers_check_is_real(make_harness: Callable[..., AppHarness]) -> None:
    harness = make_harness(start_worker=False, CELERY_BROKER_URL="filesystem://")
    assert ready(harness)[1]["checks"]["broker"] == "ok"
    folder = pathlib.Path(harness.env["VAR_DIR"]) / "broker"
    shutil.rmtree(folder)
    folder.write_text("not a folder")  # no message can be written under it
    status, body, _ = ready(harness)
    assert status == 503 and body["checks"]["broker"] == "unavailable", body


def age_the_outbox(harness: AppHarness, seconds: float) -> None:
    with harness.app.app_context():
        db.session.execute(update(TaskOutbox).values(created_at=TaskOutbox.created_at - seconds))
        db.session.commit()
        db.session.remove()


def test_ready_says_no_worker_consumes_while_work_waits(make_harness: Callable[..., AppHarness]) -> None:
    bound = 30.0
    harness = make_harness(start_worker=False, WORKER_CONSUME_BOUND=bound, WORKER_HEARTBEAT_INTERVAL=0.5)
    key = harness.create_app("greeting")["api_key"]
    assert ready(harness)[1]["checks"]["workers"] == "ok", "nothing waits: no worker is needed"
    body = {"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "async"}
    run_id = harness.post("/v1/workflows/run", key, body).json["workflow_run_id"]
    assert ready(harness)[1]["checks"]["workers"] == "ok", "a message that just arrived waits for nobody yet"
    age_the_outbox(harness, bound + 1)  # it has waited longer than the bound for a worker
    status, answer, _ = ready(harness)
    assert status == 503 and answer["checks"]["workers"] == "unavailable" and "workers" in answer["message"]
    log = pathlib.Path(harness.env["VAR_DIR"]) / "worker.log"
    with running_worker(harness.env, log, concurrency=1):
        wait_until(lambda: ready(harness)[0] == 200, 30, "a worker's heartbeat to make the API ready")
        wait_until(lambda: run_status(harness, run_id) == "succeeded", 30, "the run")


def run_status(harness: AppHarness, run_id: str) -> str:
    with harness.app.app_context():
        try:
            run = db.session.get(WorkflowRun, run_id)
            assert run is not None
            return run.status
        finally:
            db.session.remove()


def test_a_workers_heartbeat_proves_its_consumer_answers_even_while_it_is_busy(
    make_harness: Callable[..., AppHarness],
) -> None:
    interval = 0.5
    harness = make_harness(start_worker=False, WORKER_HEARTBEAT_INTERVAL=interval)
    var = pathlib.Path(harness.env["VAR_DIR"])
    healthcheck = [sys.executable, "-m", "api.healthcheck", "fresh", str(var / "worker-heartbeat"), str(3 * interval)]

    def healthy() -> bool:
        return subprocess.run(healthcheck, cwd=ROOT, capture_output=True, check=False, timeout=30).returncode == 0

    assert not healthy(), "no worker, no heartbeat"
    key = harness.create_app(slow_greeting(tokens=2000, delay=0.05))["api_key"]
    worker = Worker(harness.env, var / "worker.log", 1)
    try:
        worker.wait_ready()
        wait_until(healthy, 30, "the worker's first heartbeat")
        body = {"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "async"}
        harness.post("/v1/workflows/run", key, body)  # its only thread is busy from here on
        wait_until(lambda: b"attempt started" in worker.log_path.read_bytes(), 30, "the run to start")
        beat = (var / next(p.name for p in var.iterdir() if p.name.startswith("worker-heartbeat"))).stat().st_mtime
        wait_until(lambda: newest_beat(var) > beat + 2 * interval, 30, "heartbeats while every thread is busy")
        assert healthy()
        worker.kill()
        wait_until(lambda: not healthy(), 30, "the dead worker's heartbeat to go stale")
    finally:
        worker.stop()


def newest_beat(var: pathlib.Path) -> float:
    return max(p.stat().st_mtime for p in var.iterdir() if p.name.startswith("worker-heartbeat"))
