"""The gaps between processes: runs end with no worker left and nobody reading, a task message lost
before it reached the broker is queued again, a cold stream store is a 503, and no error shows internals.
"""

from __future__ import annotations

import pathlib
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from api.core.app.apps.topics import workflow_run_topic
from api.extensions.ext_durable_stream import durable_stream
from api.models import App, WorkflowRun
from api.models.engine import db
from api.services import workflow_run_service as runs
from harness.app_env import base_env
from harness.redis_server import RedisServer
from harness.served_stack import ServedStack
from harness.waiting import wait_until
from tests.app.conftest import AppHarness
from tests.app.test_events_sse import events_of, reconnect, run_streaming, stream
from tests.app.test_service_api import slow_greeting, wait_for_events

#: What a message for users must never carry: an address, a port, a path, a driver's words.
INTERNALS = re.compile(r"127\.0\.0\.1|localhost|:\d{2,5}\b|/tmp/|/var/|Error \d+|Traceback|connect(ing|ion refused)")


def row(harness: AppHarness, run_id: str) -> WorkflowRun:
    with harness.app.app_context():
        run = db.session.get(WorkflowRun, run_id)
        assert run is not None
        db.session.expunge(run)
        db.session.remove()
        return run


def commit_without_task(harness: AppHarness, key: str, inputs: dict[str, Any]) -> str:
    """A run committed as ``POST /workflows/run`` commits it, by an API process that died before queueing it."""
    with harness.app.app_context():
        app = db.session.query(App).filter(App.api_key == key).one()
        run = runs.create_run(app, inputs, "u1")
        run_id: str = run.id
        db.session.remove()
        return run_id


def test_a_read_ends_a_run_whose_worker_died(make_harness: Callable[..., AppHarness]) -> None:
    # No reaper anywhere: the only thing that looks at the run is a client reading its detail.
    harness = make_harness(WORKFLOW_LEASE_TTL=2, WORKFLOW_REAPER_INTERVAL=0)
    key = harness.create_app(slow_greeting(delay=0.05, tokens=2000))["api_key"]
    body = {"inputs": {"name": "Al"}, "user": "u1", "response_mode": "async"}
    run_id = harness.post("/v1/workflows/run", key, body).json["workflow_run_id"]
    wait_for_events(harness, run_id, lambda es: any(e["event"] == "text_chunk" for e in es))
    assert harness.worker is not None
    harness.worker.kill()
    lease_ends = row(harness, run_id).lease_expires_at
    assert lease_ends is not None
    wait_until(lambda: time.time() > lease_ends + 0.1, 10, "the lease to expire")
    detail = harness.get(f"/v1/workflows/run/{run_id}?user=u1", key).json
    assert detail["status"] == "failed" and "stopped responding" in detail["error"]
    events = harness.events(run_id)
    assert events[-1]["event"] == "workflow_finished" and events[-1]["data"]["status"] == "failed"
    assert harness.topic_info(run_id).sealed


def test_a_run_whose_task_never_reached_the_broker_is_queued_again(make_harness: Callable[..., AppHarness]) -> None:
    grace, sweep = 1.0, 0.3
    harness = make_harness(WORKFLOW_DISPATCH_GRACE=grace, WORKFLOW_REAPER_INTERVAL=sweep)
    key = harness.create_app("greeting")["api_key"]
    committed = time.monotonic()
    run_id = commit_without_task(harness, key, {"name": "Bea"})
    wait_until(lambda: row(harness, run_id).status == "succeeded", 20, "the worker's reaper to queue it again")
    # Queued again after the grace and a sweep (then run); nothing else would ever queue it.
    assert time.monotonic() - committed < 10 * (grace + sweep), "queued again within the grace and one sweep"
    names = [e["event"] for e in harness.events(run_id)]
    assert names[0] == "workflow_started" and names.count("workflow_started") == 1 and names[-1] == "workflow_finished"


def test_a_read_queues_a_lost_task_again_and_duplicates_run_once(make_harness: Callable[..., AppHarness]) -> None:
    harness = make_harness(WORKFLOW_DISPATCH_GRACE=0.5, WORKFLOW_REAPER_INTERVAL=0)
    key = harness.create_app("greeting")["api_key"]
    run_id = commit_without_task(harness, key, {"name": "Cy"})
    wait_until(lambda: time.time() > (row(harness, run_id).dispatched_at or 0) + 0.6, 5, "the grace")
    assert harness.get(f"/v1/workflows/run/{run_id}?user=u1", key).json["status"] == "running"
    assert row(harness, run_id).queued_at is not None, "the read queued the lost task again"
    with harness.app.app_context():  # and an API process that was only slow sends its message after all
        run = db.session.get(WorkflowRun, run_id)
        assert run is not None
        runs.dispatch(run)
        runs.dispatch(run)
        db.session.remove()
    wait_until(lambda: row(harness, run_id).status == "succeeded", 20, "the run to end")
    wait_until(lambda: harness.topic_info(run_id).sealed, 10, "its end")
    names = [e["event"] for e in harness.events(run_id)]
    assert names.count("workflow_started") == 1 and names.count("workflow_finished") == 1, names


def test_the_api_ends_runs_with_no_worker_left_and_nobody_reading(tmp_path: pathlib.Path) -> None:
    lease, sweep = 2.0, 0.5
    env = base_env(tmp_path, WORKFLOW_LEASE_TTL=lease, API_REAPER_INTERVAL=sweep, WORKFLOW_REAPER_INTERVAL=0)
    with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=2) as stack:
        key = stack.create_app(slow_greeting(delay=0.05, tokens=2000))
        started = requests.post(
            f"{stack.urls[0]}/v1/workflows/run",
            json={"inputs": {"name": "Di"}, "user": "u1", "response_mode": "async"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).json()
        run_id = started["workflow_run_id"]
        wait_until(lambda: (stack.run_row(run_id) or {}).get("attempt_started_at"), 20, "a worker to take the run")
        stack.celery[0].kill()  # the only worker; nobody reads the run from here on
        killed = time.monotonic()
        wait_until(lambda: (stack.run_row(run_id) or {}).get("status") == "failed", 30, "the API's reaper")
        took = time.monotonic() - killed
        # The documented bound is the lease plus one sweep; without the API's reaper it would never end.
        assert took < 4 * (lease + sweep), f"ended {took:.1f} s after the kill"
        wait_until(lambda: (stack.run_row(run_id) or {}).get("stream_ended"), 10, "the run's end in its topic")
        with stack.app.app_context():
            info = durable_stream().admin.topic_info(workflow_run_topic("workflow", run_id))
            assert info is not None and info.sealed
        assert (stack.run_row(run_id) or {}).get("error", "").endswith("(lease expired)")


@pytest.fixture
def cold(
    make_harness: Callable[..., AppHarness], tmp_path: pathlib.Path
) -> Iterator[tuple[AppHarness, dict[str, Any]]]:
    """A fresh API process whose first use of the stream store falls inside an outage, and what exists:
    a finished run with a resume token, and a paused run with its form."""
    with RedisServer() as store:
        warm = make_harness(DURABLE_STREAM_URL=f"{store.url}?key_prefix=cold:")
        key = warm.create_app("greeting")["api_key"]
        finished = [m for m in run_streaming(warm, key, {"name": "Ed"}) if not m.is_ping]
        paused = warm.post("/v1/workflows/run", key, {"inputs": {"name": "Fa", "mood": "formal"}, "user": "u1"}).json
        store.kill()
        fresh = AppHarness(dict(warm.env), None)
        try:
            yield fresh, {"key": key, "finished": finished, "paused": paused}
        finally:
            fresh.close()


def assert_clean(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.json["code"] == code
    assert not INTERNALS.search(response.json["message"]), response.json["message"]
    if status == 503:
        assert int(response.headers["Retry-After"]) > 0


def test_every_endpoint_of_a_fresh_process_maps_a_cold_store(cold: tuple[AppHarness, dict[str, Any]]) -> None:
    harness, made = cold
    key, finished, paused = made["key"], made["finished"], made["paused"]
    run_id, task_id = finished[0].json["workflow_run_id"], finished[0].json["task_id"]
    body = {"inputs": {"name": "Gil"}, "user": "u1"}
    for mode in ("streaming", "blocking"):
        assert_clean(harness.post("/v1/workflows/run", key, {**body, "response_mode": mode}), 503, "stream_unavailable")
    garbage = reconnect(harness, key, run_id, "u1", last_event_id="garbage")
    assert_clean(garbage, 400, "invalid_resume_token")
    assert_clean(reconnect(harness, key, task_id, "u1", last_event_id=finished[1].id), 503, "stream_unavailable")
    assert_clean(reconnect(harness, key, run_id, "u1"), 503, "stream_unavailable")  # a snapshot
    # Without a snapshot a finished run is its row's end alone: the store is not needed.
    only = events_of(stream(reconnect(harness, key, run_id, "u1", include_state_snapshot="false")))
    assert [e["event"] for e in only] == ["workflow_finished"]
    assert harness.get(f"/v1/workflows/run/{run_id}?user=u1", key).json["status"] == "succeeded"
    token = paused["data"]["reasons"][0]["form_token"]
    assert harness.get(f"/v1/form/human_input/{token}", key).status_code == 200
    stop = harness.post(f"/v1/workflows/tasks/{paused['task_id']}/stop", key, {"user": "u1"})
    assert stop.status_code == 200  # the row ends now; its end in the topic waits for the store
    assert harness.get(f"/v1/workflows/run/{paused['workflow_run_id']}?user=u1", key).json["status"] == "stopped"
    failed = [r for r in _runs(harness) if r.status == "failed"]
    assert len(failed) == 2 and all(not INTERNALS.search(r.error or "") for r in failed), [r.error for r in failed]


def _runs(harness: AppHarness) -> list[WorkflowRun]:
    with harness.app.app_context():
        rows = db.session.query(WorkflowRun).all()
        for run in rows:
            db.session.expunge(run)
        db.session.remove()
        return rows
