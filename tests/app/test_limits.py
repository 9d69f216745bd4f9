"""Per-tenant limits: 429 with Retry-After at the configured number, counted across two API processes (two
gunicorn servers, requests alternating between them), in Redis or (without one) in the app database;
and the counts come back to 0 when the clients are gone (their runs end, their windows pass, their
streams' slots are released or their leases run out).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import pathlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from flask import Flask

from api.app_factory import create_app
from api.configs import AppConfig
from api.libs.errors import TooManyRequestsError
from api.services import limits
from harness.app_env import base_env
from harness.processes import ROOT, Worker, process_env
from harness.served_stack import GunicornServer
from harness.services import redis_url
from harness.waiting import wait_until
from tests.app import examples
from tests.app.test_service_api import slow_greeting

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

GREETING = examples.greeting()
#: Where the limits count: the database (no Redis configured: the embedded profile) or the app's Redis.
STORES = {"database": {}, "redis": {"REDIS_URL": redis_url(0)}}


def served_env(directory: pathlib.Path, store: str, **settings: Any) -> dict[str, str]:
    return base_env(directory, **STORES[store], **settings)


def new_app(env: dict[str, str], definition: dict[str, Any] | None = None) -> tuple[Flask, dict[str, Any]]:
    app = create_app(AppConfig(**env))  # type: ignore[arg-type]
    from api.services import app_service

    with app.app_context():
        created = app_service.create_app(definition or GREETING)
        info = {"app_id": created.id, "api_key": created.api_key, "site_code": created.site_code}
    return app, info


@contextlib.contextmanager
def two_servers(env: dict[str, str], directory: pathlib.Path) -> Iterator[list[str]]:
    """Two API processes (a gunicorn master with one worker each) on the same settings; their URLs."""
    with (
        GunicornServer(env, directory, workers=1, name="api-a") as first,
        GunicornServer(env, directory, workers=1, name="api-b") as second,
    ):
        yield [first.url, second.url]


def burst(count: int, call: Any) -> tuple[list[requests.Response], float]:
    """``count`` calls at once, ``call(i)`` for each i (alternate the servers by it); and how long it took."""
    barrier = threading.Barrier(count)

    def one(index: int) -> requests.Response:
        barrier.wait()
        return call(index)  # type: ignore[no-any-return]

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(one, range(count)))
    return answers, time.monotonic() - started


def both_refused(answers: list[requests.Response], ok: int) -> None:
    """Both processes accepted or refused some: the count is one across them (not one per process)."""
    assert {index % 2 for index, answer in enumerate(answers) if answer.status_code == 429} == {0, 1}, [
        answer.status_code for answer in answers
    ]
    assert sum(answer.status_code == ok for answer in answers) > 0


def assert_refused(response: requests.Response, limit: str, retry_after: range) -> None:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["code"] == "rate_limit_error" and body["limit"] == limit and body["status"] == 429
    assert int(response.headers["Retry-After"]) in retry_after


@pytest.mark.parametrize("store", list(STORES))
def test_run_starts_per_second(tmp_path: pathlib.Path, store: str) -> None:
    limit = 8
    env = served_env(tmp_path, store, LIMIT_RUN_STARTS_PER_SECOND=limit)
    _, created = new_app(env)
    headers = {"Authorization": f"Bearer {created['api_key']}"}
    body = {"inputs": {"name": "x"}, "user": "u", "response_mode": "async"}
    with two_servers(env, tmp_path) as urls:

        def start(index: int = 0) -> requests.Response:
            return requests.post(f"{urls[index % 2]}/v1/workflows/run", json=body, headers=headers, timeout=30)

        # The window slides over one second: the first `limit` starts go through, and no second of the
        # burst lets more through, however long this machine takes for it (exactly the limit when the
        # burst fits in one second, as it does on an idle machine).
        answers, took = burst(3 * limit, start)
        accepted = [answer for answer in answers if answer.status_code == 202]
        assert limit <= len(accepted) <= limit * math.ceil(took), (took, [answer.status_code for answer in answers])
        for answer in answers:
            if answer.status_code != 202:
                assert_refused(answer, "run_starts", range(1, 2))
        both_refused(answers, 202)
        # After its Retry-After, the window has room again.
        time.sleep(1.0)
        assert start().status_code == 202


@pytest.mark.parametrize("store", list(STORES))
def test_passports_per_address_and_minute(tmp_path: pathlib.Path, store: str) -> None:
    limit = 5
    env = served_env(tmp_path, store, LIMIT_PASSPORTS_PER_MINUTE=limit)
    _, created = new_app(env)
    with two_servers(env, tmp_path) as urls:

        def passport(index: int) -> requests.Response:
            code = {"X-App-Code": created["site_code"]}
            return requests.get(f"{urls[index % 2]}/api/passport", headers=code, timeout=30)

        answers, _ = burst(3 * limit, passport)
        assert sum(answer.status_code == 200 for answer in answers) == limit
        for answer in answers:
            if answer.status_code != 200:
                # At most the minute: 61 when a concurrent passport, stamped a moment after this
                # request read the clock, is the window's oldest.
                assert_refused(answer, "passports", range(55, 62))
        both_refused(answers, 200)


@pytest.mark.parametrize("store", list(STORES))
def test_active_runs_per_app_come_back_when_a_dead_workers_runs_end(tmp_path: pathlib.Path, store: str) -> None:
    limit = 2
    env = served_env(tmp_path, store, APP_MAX_ACTIVE_REQUESTS=limit, API_REAPER_INTERVAL=1, LIMIT_RETRY_AFTER=3)
    app, created = new_app(env, slow_greeting(delay=0.5, tokens=400))
    headers = {"Authorization": f"Bearer {created['api_key']}"}
    body = {"inputs": {"name": "x"}, "user": "u", "response_mode": "async"}
    worker = Worker(env, tmp_path / "worker.log")
    worker.wait_ready()
    try:
        with two_servers(env, tmp_path) as urls:

            def start(index: int = 0) -> requests.Response:
                return requests.post(f"{urls[index % 2]}/v1/workflows/run", json=body, headers=headers, timeout=30)

            answers, _ = burst(4 * limit, start)
            assert sum(answer.status_code == 202 for answer in answers) == limit
            for answer in answers:
                if answer.status_code != 202:
                    assert_refused(answer, "active_runs", range(3, 4))
            both_refused(answers, 202)
            started = [answer.json()["workflow_run_id"] for answer in answers if answer.status_code == 202]

            def claimed() -> bool:
                from api.models import WorkflowRun
                from api.models.engine import db

                with app.app_context():
                    rows = [db.session.get(WorkflowRun, run_id) for run_id in started]
                    db.session.remove()
                return all(row is not None and row.attempt_started_at is not None for row in rows)

            wait_until(claimed, 30, "the worker to run both")
            worker.kill()  # the runs' worker dies: their leases expire, the API's reaper fails them
            budget = float(env["WORKFLOW_LEASE_TTL"]) + 2 * 1 + 10
            wait_until(lambda: start().status_code == 202, budget, "a start to be accepted again", interval=0.5)
    finally:
        worker.stop()


@pytest.mark.parametrize("store", list(STORES))
def test_gateway_streams_and_bytes_per_key(tmp_path: pathlib.Path, store: str) -> None:
    env = served_env(
        tmp_path,
        store,
        DURABLE_STREAMS_GATEWAY_PREFIX="/ds",
        LIMIT_GATEWAY_STREAMS_PER_MINUTE=4,
        LIMIT_GATEWAY_BYTES_PER_MINUTE=1024 * 1024,
    )
    _, streams_app = new_app(env)
    _, bytes_app = new_app(env)
    with two_servers(env, tmp_path) as urls:

        def create(app: dict[str, Any], size: int, index: int) -> requests.Response:
            return requests.put(
                f"{urls[index % 2]}/ds/apps/{app['app_id']}/{uuid.uuid4().hex}",
                data=b"x" * size,
                headers={"Authorization": f"Bearer {app['api_key']}", "Content-Type": "application/octet-stream"},
                timeout=30,
            )

        answers, _ = burst(12, lambda index: create(streams_app, 10, index))
        assert sum(answer.status_code == 201 for answer in answers) == 4
        refused = [answer for answer in answers if answer.status_code != 201]
        assert all(answer.status_code == 429 and answer.text.startswith("rate_limit_error") for answer in refused)
        # 61 when a concurrent create, stamped just after this request read the clock, is the window's oldest.
        assert all(55 <= int(answer.headers["Retry-After"]) <= 61 for answer in refused)
        both_refused(answers, 201)
        # 20 creates of 500 KiB: two fit in the key's MiB a minute, the rest are refused before they are stored.
        answers, _ = burst(20, lambda index: create(bytes_app, 500 * 1024, index))
        assert sum(answer.status_code == 201 for answer in answers) == 2
        assert all(answer.status_code in (201, 429) for answer in answers)
        both_refused(answers, 201)


HOLDER = """
import sys, time
from api.app_factory import create_app
from api.configs import AppConfig
from api.services import limits
from tests.app import examples

app = create_app(AppConfig())
with app.app_context():
    slots = [limits.acquire_stream(sys.argv[1], sys.argv[2]) for _ in range(int(sys.argv[3]))]
    print("held", flush=True)
    time.sleep(3600)
"""


@pytest.fixture
def slots_env(tmp_path: pathlib.Path, request: pytest.FixtureRequest) -> Iterator[tuple[Flask, dict[str, str]]]:
    env = served_env(
        tmp_path,
        request.param,
        LIMIT_SSE_STREAMS_PER_END_USER=3,
        LIMIT_SSE_STREAMS_PER_KEY=5,
        LIMIT_SSE_LEASE_SECONDS=2,
    )
    app = create_app(AppConfig(**env))  # type: ignore[arg-type]
    yield app, env


@pytest.mark.parametrize("slots_env", list(STORES), indirect=True)
def test_stream_slots_are_counted_across_processes_and_expire_with_a_dead_one(
    slots_env: tuple[Flask, dict[str, str]],
) -> None:
    app, env = slots_env
    app_id = f"app-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, app_id, "alice", "2"],
        cwd=ROOT,
        env=process_env(env),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with app.app_context():
            assert limits.stream_counts(app_id, "alice") == (2, 2)
            mine = limits.acquire_stream(app_id, "alice")  # the third of alice's three
            with pytest.raises(TooManyRequestsError) as refused:
                limits.acquire_stream(app_id, "alice")
            assert refused.value.limit == "sse_streams_per_end_user" and refused.value.retry_after >= 1
            others = [limits.acquire_stream(app_id, "bob"), limits.acquire_stream(app_id, "carol")]
            with pytest.raises(TooManyRequestsError) as full:
                limits.acquire_stream(app_id, "dave")
            assert full.value.limit == "sse_streams_per_key"
            assert limits.stream_counts(app_id, "alice") == (3, 5)
            # The slots this process holds are renewed past their lease; the dead process's are not.
            holder.kill()
            holder.wait(timeout=10)
            lease = float(env["LIMIT_SSE_LEASE_SECONDS"])
            wait_until(lambda: limits.stream_counts(app_id, "alice") == (1, 3), 3 * lease, "the dead one's slots")
            time.sleep(lease)  # one more lease: the renewer keeps this process's own
            assert limits.stream_counts(app_id, "alice") == (1, 3)
            for slot in [mine, *others]:
                limits.release_stream(slot)
            assert limits.stream_counts(app_id, "alice") == (0, 0)
            limits.release_stream(limits.acquire_stream(app_id, "alice"))
            assert limits.stream_counts(app_id, "alice") == (0, 0)
    finally:
        holder.kill()
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()


@pytest.mark.parametrize("store", list(STORES))
def test_open_event_streams_past_the_limits_are_429_and_given_back_when_clients_leave(
    tmp_path: pathlib.Path, store: str
) -> None:
    """Streams of one end user and of one app, across two API processes: the next one past a limit is 429
    with Retry-After, a streaming start past it creates no run, and the counts return to 0 once the
    clients are gone (a parked stream notices at its next ping)."""
    ping = 0.5
    env = served_env(
        tmp_path,
        store,
        LIMIT_SSE_STREAMS_PER_END_USER="3",
        LIMIT_SSE_STREAMS_PER_KEY="4",
        LIMIT_RETRY_AFTER="7",
        SSE_PING_INTERVAL=str(ping),
    )
    app, info = new_app(env)
    key, app_id = info["api_key"], info["app_id"]
    headers = {"Authorization": f"Bearer {key}"}
    worker = Worker(env, tmp_path / "worker.log")
    worker.wait_ready()
    request_finalizer = worker.stop
    with two_servers(env, tmp_path) as urls:
        paused = {}
        for user in ("alice", "bob"):
            run = requests.post(
                f"{urls[0]}/v1/workflows/run",
                json={"inputs": {"name": user, "mood": "formal"}, "user": user, "response_mode": "blocking"},
                headers=headers,
                timeout=60,
            ).json()
            assert run["data"]["status"] == "paused", run
            paused[user] = run["task_id"]
        opened: list[requests.Response] = []

        def open_stream(index: int, user: str) -> requests.Response:
            # A run waiting for its form keeps these open: a tail, and a replay that goes on through the pause.
            query = "&include_state_snapshot=true&continue_on_pause=true" if index % 2 else ""
            url = f"{urls[index % 2]}/v1/workflow/{paused[user]}/events?user={user}{query}"
            response = requests.get(url, headers=headers, stream=True, timeout=30)
            opened.append(response)
            return response

        try:
            assert [open_stream(index, "alice").status_code for index in range(3)] == [200] * 3
            assert_refused(open_stream(3, "alice"), "sse_streams_per_end_user", range(7, 8))
            assert open_stream(4, "bob").status_code == 200
            assert_refused(open_stream(5, "bob"), "sse_streams_per_key", range(7, 8))
            # A streaming start past the app's limit is refused before a run exists.
            with app.app_context():
                from api.models import WorkflowRun
                from api.models.engine import db

                runs_before = db.session.query(WorkflowRun).count()
                db.session.remove()
            start = requests.post(
                f"{urls[1]}/v1/workflows/run",
                json={"inputs": {"name": "carol"}, "user": "carol", "response_mode": "streaming"},
                headers=headers,
                timeout=30,
            )
            assert_refused(start, "sse_streams_per_key", range(7, 8))
            with app.app_context():
                assert db.session.query(WorkflowRun).count() == runs_before
                assert limits.stream_counts(app_id, "alice") == (3, 4)
        finally:
            for response in opened:
                response.close()
        with app.app_context():
            wait_until(lambda: limits.stream_counts(app_id, "alice") == (0, 0), 40 * ping, "the slots given back")
    request_finalizer()


def test_a_burst_of_stream_slots_goes_to_redis_in_a_few_round_trips() -> None:
    """Two hundred streams asking at once: each gets its exact answer (the limit's first 150 a slot,
    the rest refused), in far fewer pipelines than calls, and releases count before a later question."""
    import redis

    from api.services.limit_store import RedisLimitStore

    class Counting(redis.Redis):  # type: ignore[type-arg]
        pipelines = 0

        def pipeline(self, *args: Any, **kwargs: Any) -> Any:
            Counting.pipelines += 1
            return super().pipeline(*args, **kwargs)

    client = Counting.from_url(redis_url(0))
    try:
        store = RedisLimitStore(client)
        scope = f"sse:{{burst-{uuid.uuid4().hex}}}:app"
        barrier = threading.Barrier(200)

        def one(index: int) -> tuple[int, float] | None:
            barrier.wait()
            return store.acquire([(scope, 150)], f"holder-{index}", 30.0)

        with concurrent.futures.ThreadPoolExecutor(200) as pool:
            answers = list(pool.map(one, range(200)))
        assert sum(answer is None for answer in answers) == 150
        assert all(answer is None or answer[0] == 0 for answer in answers)
        assert Counting.pipelines < 100, Counting.pipelines
        for index in range(200):
            store.release([scope], f"holder-{index}")
        assert store.holders(scope) == 0  # asked after the releases: sent after them
    finally:
        client.close()
