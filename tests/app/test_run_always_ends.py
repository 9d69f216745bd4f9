"""Every accepted run ends, visibly, whatever dies: a terminal row *and* a ``workflow_finished`` at the
end of its sealed topic. Real Celery workers are killed with SIGKILL, private Redis stream stores are
killed and restarted, and topics lose their data under running runs."""

from __future__ import annotations

import pathlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from api.core.app.apps import run_store
from api.core.app.apps.event_codec import encode_event
from api.core.app.apps.topics import workflow_run_topic
from api.extensions.ext_durable_stream import durable_stream
from api.models import App, WorkflowRun
from api.models.engine import db
from api.services import workflow_run_service
from api.services.run_recovery import started_event_of
from harness.postgres_server import PostgresServer
from harness.processes import Worker
from harness.redis_server import RedisServer
from harness.services import redis_url
from harness.waiting import wait_until
from tests.app.conftest import AppHarness
from tests.app.test_events_sse import events_of, reconnect, stream
from tests.app.test_service_api import slow_greeting

pytestmark = pytest.mark.slow  # handed out first by make test (tests/conftest.py)

#: A Redis database of its own, so that the broker's "unacked" bookkeeping can be read exactly.
KILL_BROKER_URL = redis_url(2)


def row(harness: AppHarness, run_id: str) -> dict[str, Any]:
    with harness.app.app_context():
        run = db.session.get(WorkflowRun, run_id)
        assert run is not None
        values = {column.name: getattr(run, column.name) for column in WorkflowRun.__table__.columns}
        db.session.remove()
        return values


def ended(harness: AppHarness, run_id: str) -> bool:
    values = row(harness, run_id)
    if values["status"] not in ("succeeded", "failed", "stopped") or not values["stream_ended"]:
        return False
    return harness.sealed(run_id) is not None


def assert_ended_visibly(harness: AppHarness, key: str, run_id: str, user: str = "u1") -> list[dict[str, Any]]:
    """The row is terminal, the sealed topic ends with exactly one matching ``workflow_finished``, and
    a reader that connects now reads the same history from ``workflow_started`` to that end."""
    values = row(harness, run_id)
    assert values["status"] in ("succeeded", "failed", "stopped"), values
    info = harness.topic_info(run_id)
    assert info is not None and info.sealed, info
    events = harness.events(run_id)
    names = [event["event"] for event in events]
    assert names[0] == "workflow_started" and names.count("workflow_started") == 1, names
    assert names[-1] == "workflow_finished" and names.count("workflow_finished") == 1, names
    assert events[-1]["data"]["status"] == values["status"]
    read = events_of(stream(reconnect(harness, key, values["task_id"], user)))
    assert read == events, "a late reader sees exactly the stored history"
    return events


def start_async(harness: AppHarness, key: str, name: str = "x") -> dict[str, str]:
    response = harness.post(
        "/v1/workflows/run", key, {"inputs": {"name": name}, "user": "u1", "response_mode": "async"}
    )
    assert response.status_code == 202, response.json
    return dict(response.json)


def has_text(harness: AppHarness, run_id: str) -> bool:
    return any(event["event"] == "text_chunk" for event in harness.events(run_id))


@pytest.fixture
def workers() -> Iterator[Callable[[AppHarness, int], Worker]]:
    started: list[Worker] = []

    def start(harness: AppHarness, concurrency: int = 2) -> Worker:
        log = pathlib.Path(harness.env["VAR_DIR"]) / f"worker-{uuid.uuid4().hex[:6]}.log"
        worker = Worker(harness.env, log, concurrency)
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.mark.parametrize("broker", ["redis", "filesystem"])
def test_started_and_prefetched_runs_of_a_killed_worker_all_end(
    make_harness: Callable[..., AppHarness], workers: Callable[[AppHarness, int], Worker], broker: str
) -> None:
    visibility, lease, sweep, start_timeout = 3, 4, 0.5, 8 if broker == "filesystem" else 120
    delay, tokens = 0.02, 250
    harness = make_harness(
        start_worker=False,
        CELERY_BROKER_URL=KILL_BROKER_URL if broker == "redis" else "filesystem://",
        CELERY_PREFETCH_MULTIPLIER=4,  # a deployment that lets workers hold messages they have not started
        CELERY_VISIBILITY_TIMEOUT=visibility,
        # Long enough that the survivor's renewals survive a loaded machine (make test runs files in
        # parallel): a lapse there would fail a healthy redelivered run.
        WORKFLOW_LEASE_TTL=lease,
        WORKFLOW_REAPER_INTERVAL=sweep,
        WORKFLOW_START_TIMEOUT=start_timeout,
    )
    key = harness.create_app(slow_greeting(delay=delay, tokens=tokens))["api_key"]
    doomed = workers(harness, 1)
    runs = [start_async(harness, key, f"r{index}") for index in range(3)]
    started, *prefetched = (run["workflow_run_id"] for run in runs)
    wait_until(lambda: has_text(harness, started), 30, "the first run to stream")

    # The other two are in the worker's hands but not started: prefetched.
    if broker == "redis":
        client = redis.Redis.from_url(KILL_BROKER_URL)
        wait_until(lambda: client.hlen("unacked") >= 2, 10, "the prefetched messages, unacknowledged")
    else:
        queue = pathlib.Path(harness.env["VAR_DIR"]) / "broker" / "queue"
        wait_until(lambda: not list(queue.glob("*.msg")), 10, "the worker to take every message")
    assert all(row(harness, run_id)["attempt_started_at"] is None for run_id in prefetched)

    doomed.kill()
    killed_at = time.monotonic()
    survivor = workers(harness, 2)
    for run_id in (started, *prefetched):
        wait_until(lambda run_id=run_id: ended(harness, run_id), 60, f"run {run_id} to end")  # type: ignore[misc]
    elapsed = time.monotonic() - killed_at

    events = assert_ended_visibly(harness, key, started)
    assert events[-1]["data"]["status"] == "failed" and "lease expired" in events[-1]["data"]["error"]
    for run_id in prefetched:
        events = assert_ended_visibly(harness, key, run_id)
        if broker == "redis":  # given back by the broker and run by the survivor
            assert events[-1]["data"]["status"] == "succeeded", events[-1]["data"]["error"]
        else:  # the filesystem broker deleted them when the dead worker fetched them
            assert events[-1]["data"]["status"] == "failed"
            assert "no worker started the run" in events[-1]["data"]["error"]
    # Each run ends by what its settings promise: the started one at its lease and a sweep; a prefetched
    # one given back after the visibility timeout and run whole by the survivor (Redis), or failed at its
    # start timeout (filesystem). Four times that for a loaded machine.
    promised = lease + sweep + visibility + (start_timeout if broker == "filesystem" else delay * tokens)
    assert elapsed < 4 * promised, (elapsed, promised)
    if broker == "filesystem":
        assert "reaper:" in survivor.log_path.read_text(), "the survivor's reaper ended them"


def test_a_blocking_request_learns_that_the_worker_died(make_harness: Callable[..., AppHarness]) -> None:
    harness = make_harness(WORKFLOW_LEASE_TTL=2, WORKFLOW_REAPER_INTERVAL=0, BLOCKING_RESPONSE_TIMEOUT=60)
    key = harness.create_app(slow_greeting(delay=0.05, tokens=2000))["api_key"]
    answer: dict[str, Any] = {}

    def blocking() -> None:
        response = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Bo"}, "user": "u1"})
        answer.update(status=response.status_code, body=response.json, at=time.monotonic())

    thread = threading.Thread(target=blocking)
    thread.start()

    def running_run() -> str | None:
        with harness.app.app_context():
            run = db.session.query(WorkflowRun).one_or_none()
            db.session.remove()
            return run.id if run is not None and has_text(harness, run.id) else None

    run_id = wait_until(running_run, 30, "the blocking run to stream")
    assert harness.worker is not None
    harness.worker.kill()
    killed_at = time.monotonic()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the blocking request was still waiting 30 s after its worker died"
    assert answer["status"] == 200 and answer["body"]["data"]["status"] == "failed"
    assert answer["at"] - killed_at < 2 + 5, "lease TTL + a check interval + slack"
    assert_ended_visibly(harness, key, run_id)


@pytest.mark.parametrize("persistence", ["aof", "none"])
def test_the_end_survives_a_stream_store_restart(make_harness: Callable[..., AppHarness], persistence: str) -> None:
    with RedisServer(appendonly=persistence == "aof") as store:
        harness = make_harness(DURABLE_STREAM_URL=f"{store.url}?key_prefix=end:", WORKFLOW_END_RETRY_DEADLINE=30)
        key = harness.create_app(slow_greeting(delay=0.02, tokens=400))["api_key"]
        run = start_async(harness, key)
        run_id = run["workflow_run_id"]
        wait_until(lambda: has_text(harness, run_id), 30, "the run to stream")
        token_before = first_token(harness, key, run["task_id"])
        store.kill()
        time.sleep(1.0)  # the outage itself
        store.start()
        wait_until(lambda: ended(harness, run_id), 40, "the run to end")

        values = row(harness, run_id)
        assert values["status"] == "failed" and "event stream was unavailable" in values["error"]
        if persistence == "aof":
            events = assert_ended_visibly(harness, key, run_id)
            resumed = events_of(stream(reconnect(harness, key, run["task_id"], "u1", last_event_id=token_before)))
            assert resumed == events[1:], "a resume from before the outage continues with nothing lost"
        else:  # the store lost the run's start: the end went to a new incarnation of the topic
            assert [e["event"] for e in harness.events(run_id)] == ["workflow_finished"]
            assert harness.topic_info(run_id).sealed
            assert_gone(reconnect(harness, key, run["task_id"], "u1"), "run_events_lost", run_id)
            expired = reconnect(harness, key, run["task_id"], "u1", last_event_id=token_before)
            assert_gone(expired, "resume_cursor_expired", run_id)


@pytest.mark.parametrize("persistence", ["aof", "none"])
def test_an_end_still_pending_after_the_deadline_is_repaired(
    make_harness: Callable[..., AppHarness], persistence: str
) -> None:
    with RedisServer(appendonly=persistence == "aof") as store:
        harness = make_harness(
            DURABLE_STREAM_URL=f"{store.url}?key_prefix=pending:",
            WORKFLOW_END_RETRY_DEADLINE=1,
            WORKFLOW_REAPER_INTERVAL=0.5,
        )
        key = harness.create_app(slow_greeting(delay=0.02, tokens=400))["api_key"]
        run_id = start_async(harness, key)["workflow_run_id"]
        wait_until(lambda: has_text(harness, run_id), 30, "the run to stream")
        store.kill()
        wait_until(lambda: row(harness, run_id)["status"] == "failed", 20, "the worker to record the failure")
        assert not row(harness, run_id)["stream_ended"], "the end is pending while the store is away"
        time.sleep(2.0)  # the store stays away past the worker's retry deadline
        store.start()
        wait_until(lambda: ended(harness, run_id), 30, "the reaper to write the pending end")
        if persistence == "aof":
            assert_ended_visibly(harness, key, run_id)
        else:
            # Found by the soak: the repair wrote a synthetic workflow_started into the new, empty
            # incarnation, so the lost run looked whole. A run that stored its start gets none.
            assert [e["event"] for e in harness.events(run_id)] == ["workflow_finished"]
            assert_gone(reconnect(harness, key, row(harness, run_id)["task_id"], "u1"), "run_events_lost", run_id)


def first_token(harness: AppHarness, key: str, task_id: str) -> str:
    for message in stream(reconnect(harness, key, task_id, "u1"), limit=3):
        if message.id:
            return message.id
    raise AssertionError("no event with a token")


def assert_gone(response: Any, code: str, run_id: str) -> None:
    assert response.status_code == 410, response.get_data(as_text=True)
    body = response.json
    assert body["code"] == code and body["status"] == 410
    assert body["run"]["id"] == run_id, "a 410 carries the run row"


def test_a_topic_that_lost_its_data_is_never_shown_as_a_run(harness: AppHarness) -> None:
    key = harness.create_app(slow_greeting(delay=0.01, tokens=300))["api_key"]
    run = start_async(harness, key)
    run_id = run["workflow_run_id"]
    wait_until(lambda: has_text(harness, run_id), 30, "the run to stream")
    token_before = first_token(harness, key, run["task_id"])
    with harness.app.app_context():  # as a store without persistence that restarted
        durable_stream().admin.delete_topic(workflow_run_topic("workflow", run_id))
    wait_until(lambda: harness.events(run_id), 10, "the worker to append to the new incarnation")
    assert harness.events(run_id)[0]["event"] != "workflow_started"

    assert_gone(reconnect(harness, key, run["task_id"], "u1"), "run_events_lost", run_id)
    wait_until(lambda: ended(harness, run_id), 30, "the run to end")
    assert_gone(reconnect(harness, key, run["task_id"], "u1"), "run_events_lost", run_id)
    assert_gone(
        reconnect(harness, key, run["task_id"], "u1", last_event_id=token_before), "resume_cursor_expired", run_id
    )


def test_a_run_whose_start_was_trimmed_is_410_not_a_partial_run(harness: AppHarness) -> None:
    key = harness.create_app("greeting")["api_key"]
    body = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Ed"}, "user": "u1"}).json
    with harness.app.app_context():
        durable_stream().admin.trim_topic(workflow_run_topic("workflow", body["workflow_run_id"]), keep_last=3)
    assert_gone(reconnect(harness, key, body["task_id"], "u1"), "run_events_lost", body["workflow_run_id"])


def test_a_streaming_client_that_drops_before_any_event_can_reconnect(harness: AppHarness) -> None:
    key = harness.create_app(slow_greeting(delay=0.005, tokens=100))["api_key"]
    response = harness.client.post(
        "/v1/workflows/run",
        json={"inputs": {"name": "Fi"}, "user": "u1", "response_mode": "streaming"},
        headers={"Authorization": f"Bearer {key}"},
        buffered=False,
    )
    # The ids are in the headers, before any event: a client that drops at once can still come back.
    task_id, run_id = response.headers["X-Task-Id"], response.headers["X-Workflow-Run-Id"]
    assert task_id and run_id
    (ping,) = stream(response, limit=1)  # then the client is gone
    assert ping.is_ping
    events = events_of(stream(reconnect(harness, key, run_id, "u1")))
    assert events[0]["event"] == "workflow_started" and events[-1]["event"] == "workflow_finished"
    assert events == harness.events(run_id)


def test_duplicate_and_stale_deliveries_run_nothing(harness: AppHarness) -> None:
    key = harness.create_app("greeting")["api_key"]
    paused = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Gil", "mood": "formal"}, "user": "u1"}).json
    run_id = paused["workflow_run_id"]
    first_attempt = row(harness, run_id)["attempt_id"]
    ok = harness.post(f"/v1/workflows/runs/{run_id}/human-input", key, {"user": "u1", "inputs": {"approved": "true"}})
    assert ok.status_code == 200
    wait_until(lambda: ended(harness, run_id), 30, "the resumed run to end")
    events = harness.events(run_id)
    second_attempt = row(harness, run_id)["attempt_id"]
    assert second_attempt != first_attempt

    celery_app = harness.app.extensions["celery"]
    queue = harness.env["CELERY_QUEUE"]
    assert harness.worker is not None
    log = harness.worker.log_path
    seen = log.read_text().count("not this delivery's to run")
    celery_app.send_task(
        "workflow_based_app_execution_task", args=[run_id], kwargs={"attempt_id": first_attempt}, queue=queue
    )
    celery_app.send_task(
        "resume_app_execution", args=[run_id, {"approved": "false"}], kwargs={"attempt_id": second_attempt}, queue=queue
    )
    wait_until(lambda: log.read_text().count("not this delivery's to run") >= seen + 2, 20, "both deliveries")
    assert harness.events(run_id) == events, "a stale or duplicate delivery appended nothing"
    assert row(harness, run_id)["status"] == "succeeded"


def test_runs_survive_an_app_database_restart(make_harness: Callable[..., AppHarness]) -> None:
    with PostgresServer() as database:
        url = database.url.replace("postgresql://", "postgresql+psycopg://", 1)
        harness = make_harness(start_worker=False, SQLALCHEMY_DATABASE_URI=url, WORKFLOW_END_RETRY_DEADLINE=60)
        created = harness.create_app(slow_greeting(delay=0.02, tokens=100))
        worker = Worker(harness.env, pathlib.Path(harness.env["VAR_DIR"]) / "worker.log", concurrency=2)
        try:
            worker.wait_ready()
            streaming = start_async(harness, created["api_key"], "a")["workflow_run_id"]
            with harness.app.app_context():  # a run created now and queued while the database is away
                app_row = db.session.get(App, created["app_id"])
                queued = workflow_run_service.create_run(app_row, {"name": "b"}, "u1")
                db.session.refresh(queued)
                db.session.expunge(queued)
            wait_until(lambda: has_text(harness, streaming), 30, "the first run to stream")
            database.kill()
            with harness.app.app_context():
                workflow_run_service.dispatch(queued)
            log = worker.log_path
            # The first run reaches its end, whose row write waits (the row comes first); the
            # second delivery cannot claim its attempt and is retried.
            wait_until(lambda: "could not record the end of run" in log.read_text(), 30, "the end to wait")
            wait_until(lambda: "retry: Retry in" in log.read_text(), 30, "the second delivery to be retried")
            database.start()
            for run_id in (streaming, queued.id):
                wait_until(lambda run_id=run_id: ended(harness, run_id), 60, f"run {run_id} to end")  # type: ignore[misc]
                events = assert_ended_visibly(harness, created["api_key"], run_id)
                assert events[-1]["data"]["status"] == "succeeded", events[-1]
        finally:
            worker.stop()


def test_a_stream_store_that_is_down_answers_503_and_the_run_still_ends(
    make_harness: Callable[..., AppHarness],
) -> None:
    with RedisServer() as store:
        harness = make_harness(
            DURABLE_STREAM_URL=f"{store.url}?key_prefix=down:",
            WORKFLOW_END_RETRY_DEADLINE=1,
            WORKFLOW_REAPER_INTERVAL=0.5,
        )
        key = harness.create_app("greeting")["api_key"]
        finished = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Al"}, "user": "u1"}).json
        store.kill()
        body = {"inputs": {"name": "Al"}, "user": "u1"}
        for mode in ("streaming", "blocking"):
            response = harness.post("/v1/workflows/run", key, {**body, "response_mode": mode})
            assert response.status_code == 503 and response.json["code"] == "stream_unavailable", response.json
        refused = reconnect(harness, key, finished["task_id"], "u1")
        assert refused.status_code == 503 and refused.json["code"] == "stream_unavailable"
        # Without a snapshot a finished run is its row's end alone: no store is needed for that.
        only = events_of(stream(reconnect(harness, key, finished["task_id"], "u1", include_state_snapshot="false")))
        assert [e["event"] for e in only] == ["workflow_finished"]
        accepted = harness.post("/v1/workflows/run", key, {**body, "response_mode": "async"})
        assert accepted.status_code == 202  # queued; its worker cannot write its events
        run_id = accepted.json["workflow_run_id"]
        wait_until(lambda: row(harness, run_id)["status"] == "failed", 30, "the worker to give up on the run")
        with harness.app.app_context():
            refused_runs = db.session.query(WorkflowRun).filter(WorkflowRun.id != run_id).all()
            statuses = sorted(run.status for run in refused_runs)
            db.session.remove()
        assert statuses == ["failed", "failed", "succeeded"], "the two refused runs do not stay 'running'"
        store.start()
        wait_until(lambda: ended(harness, run_id), 30, "the reaper to write the pending end")
        events = assert_ended_visibly(harness, key, run_id)
        assert "event stream was unavailable" in events[-1]["data"]["error"]


def test_a_reader_ends_with_the_rows_outcome_when_the_end_stays_pending(
    make_harness: Callable[..., AppHarness],
) -> None:
    end_retry_deadline, lease_ttl = 1, 3
    harness = make_harness(
        start_worker=False, WORKFLOW_END_RETRY_DEADLINE=end_retry_deadline, WORKFLOW_LEASE_TTL=lease_ttl
    )
    key = harness.create_app("greeting")["api_key"]
    run = start_async(harness, key)  # queued; no worker takes it
    run_id = run["workflow_run_id"]
    with harness.app.app_context():
        run_row = db.session.get(WorkflowRun, run_id)
        started = started_event_of(db.session.get(App, run_row.app_id), run_row)
        durable_stream().topic(workflow_run_topic("workflow", run_id)).append(encode_event(started))
        # As a finisher that recorded the outcome and died while it retried writing the end: no
        # one may repair it for an hour, yet its readers must not wait that long.
        assert run_store.finish(run_id, "failed", outputs=None, error="gone", steps=0, repair_after=time.time() + 3600)
        db.session.remove()
    # The watcher's grace: the end retry deadline plus one of its checks (every third of the lease).
    grace = end_retry_deadline + max(0.5, lease_ttl / 3)
    opened = time.monotonic()
    messages = stream(reconnect(harness, key, run["task_id"], "u1"))
    assert time.monotonic() - opened < 5 * grace, "the reader waited past its grace period"
    events = [m for m in messages if not m.is_ping]
    assert [m.json["event"] for m in events] == ["workflow_started", "workflow_finished"]
    assert events[-1].id is None and events[-1].json["data"]["status"] == "failed"
    assert events[-1].json["data"]["error"] == "gone"
