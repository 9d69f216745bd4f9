"""``make run``'s script on the embedded defaults: gunicorn with gevent workers, a Celery worker on the
filesystem broker, SQLite for data and streams; no external service (``DEPLOY_ENV=DEVELOPMENT``, which
the script sets and tells the user to set for ``flask``)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
from collections.abc import Iterator

import pytest
import requests

from harness.processes import BIN, ROOT, free_port, process_env
from harness.waiting import wait_until


@pytest.fixture
def served(tmp_path: pathlib.Path) -> Iterator[tuple[str, dict[str, str]]]:
    port = free_port()
    env = process_env({"VAR_DIR": str(tmp_path), "PORT": str(port), "WORKFLOW_LLM_TOKEN_DELAY": "0.001"})
    for name in ("SQLALCHEMY_DATABASE_URI", "DURABLE_STREAM_URL", "CELERY_BROKER_URL", "CELERY_QUEUE", "DEPLOY_ENV"):
        env.pop(name, None)
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [str(ROOT / "bin" / "run")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"

    def api_answers() -> bool:
        assert process.poll() is None, (tmp_path / "run.log").read_text()
        try:
            requests.get(f"{base}/v1/workflows/run/x", timeout=1)
        except (requests.ConnectionError, requests.Timeout):
            return False
        return True

    try:
        wait_until(api_answers, 60, "the API to come up", interval=0.1)
        yield base, env
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_embedded_defaults_serve_a_blocking_and_an_async_run(served: tuple[str, dict[str, str]]) -> None:
    base, env = served
    created = subprocess.run(
        [str(BIN / "flask"), "--app", "api.app", "create-app", "--file", "examples/greeting.json"],
        cwd=ROOT,
        env={**env, "DEPLOY_ENV": "DEVELOPMENT"},
        capture_output=True,
        text=True,
        check=True,
    )
    key = json.loads(created.stdout)["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    blocking = requests.post(
        f"{base}/v1/workflows/run", json={"inputs": {"name": "Ada"}, "user": "me"}, headers=headers, timeout=60
    )
    assert blocking.status_code == 200, blocking.text
    assert blocking.json()["data"]["status"] == "succeeded"
    started = requests.post(
        f"{base}/v1/workflows/run",
        json={"inputs": {"name": "Bo"}, "user": "me", "response_mode": "async"},
        headers=headers,
        timeout=10,
    ).json()

    def succeeded() -> bool:
        detail = requests.get(
            f"{base}/v1/workflows/run/{started['workflow_run_id']}?user=me", headers=headers, timeout=10
        ).json()
        return bool(detail["status"] == "succeeded")

    wait_until(succeeded, 60, "the async run to succeed", interval=0.1)
    assert (pathlib.Path(env["VAR_DIR"]) / "streams.db").exists() and (pathlib.Path(env["VAR_DIR"]) / "app.db").exists()
    # A healthy start warns about nothing (kombu used to, about the filesystem broker's missing host),
    # and the worker's lines are log records, JSON by default.
    worker_log = (pathlib.Path(env["VAR_DIR"]) / "worker.log").read_text(errors="replace")
    assert "No hostname was supplied" not in worker_log
    records = [json.loads(line) for line in worker_log.splitlines()]
    # (Celery's warning about running as root is a true one: tests run as root here; the image does not.)
    warnings = [r for r in records if r["level"] == "WARNING" and "superuser privileges" not in r["message"]]
    assert records and not warnings, warnings
