"""The rollout flag's other side: workflow events over the live-only broadcast channel, as before."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

import pytest
import requests
import sqlalchemy

from harness.app_env import base_env
from harness.served_stack import ServedStack
from harness.services import redis_url
from harness.sse import parse_sse
from tests.app.conftest import AppHarness
from tests.app.test_events_sse import events_of, reconnect, run_streaming, stream
from tests.app.test_service_api import slow_greeting


@pytest.mark.parametrize("kind", ["pubsub", "sharded", "streams"])
def test_workflows_run_end_to_end_over_the_broadcast_channel(
    make_harness: Callable[..., AppHarness], kind: str
) -> None:
    harness = make_harness(EVENT_BUS_TRANSPORT="broadcast_channel", REDIS_URL=redis_url(0), BROADCAST_CHANNEL_TYPE=kind)
    key = harness.create_app("greeting")["api_key"]

    messages = run_streaming(harness, key, {"name": "Ada"})
    events = events_of(messages)
    assert events[0]["event"] == "workflow_started" and events[-1]["event"] == "workflow_finished"
    assert all(m.id is None for m in messages), "the broadcast channel has no resume positions"

    blocking = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Bo"}, "user": "u1"})
    assert blocking.status_code == 200 and blocking.json["data"]["status"] == "succeeded"

    # Last-Event-ID is ignored; a finished run gets one workflow_finished built from its row.
    finished = stream(reconnect(harness, key, events[0]["task_id"], "u1", last_event_id="anything"))
    assert [e["event"] for e in events_of(finished)] == ["workflow_finished"]
    assert harness.topic_info(events[0]["workflow_run_id"]) is None, "nothing went to the durable stream"


def test_a_broadcast_reconnect_is_live_only(make_harness: Callable[..., AppHarness]) -> None:
    harness = make_harness(EVENT_BUS_TRANSPORT="broadcast_channel", REDIS_URL=redis_url(0))
    key = harness.create_app(slow_greeting(delay=0.01, tokens=150))["api_key"]
    first = harness.client.post(
        "/v1/workflows/run",
        json={"inputs": {"name": "Cy"}, "user": "u1", "response_mode": "streaming"},
        headers={"Authorization": f"Bearer {key}"},
        buffered=False,
    )
    first_messages = parse_sse(first.response)
    task_id = None
    for message in first_messages:  # wait until the run is well under way
        if not message.is_ping and message.json["event"] == "text_chunk":
            task_id = message.json["task_id"]
            break
    assert task_id is not None
    late = reconnect(harness, key, task_id, "u1", last_event_id="ignored")
    seen = [m.json for m in parse_sse(late.response) if not m.is_ping]
    late.close()
    first.close()
    assert seen[-1]["event"] == "workflow_finished"
    assert "workflow_started" not in [e["event"] for e in seen], "a live-only reconnect does not replay the run"


def test_an_exhausted_redis_pool_is_503_busy_and_the_other_clients_go_on(tmp_path: pathlib.Path) -> None:
    # Every broadcast stream holds one connection of its worker's pool: with two, the third waits
    # REDIS_POOL_TIMEOUT and is told to come back (503 + Retry-After), never answered 500.
    env = base_env(
        tmp_path,
        EVENT_BUS_TRANSPORT="broadcast_channel",
        REDIS_URL=redis_url(0),
        REDIS_MAX_CONNECTIONS=2,
        REDIS_POOL_TIMEOUT=0.1,
        SSE_PING_INTERVAL=1,
    )
    with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=2) as stack:
        key = stack.create_app(slow_greeting(delay=0.02, tokens=100))
        auth = {"Authorization": f"Bearer {key}"}
        url = stack.urls[0]
        started = requests.post(
            f"{url}/v1/workflows/run",
            json={"inputs": {"name": "Di"}, "user": "u1", "response_mode": "async"},
            headers=auth,
            timeout=10,
        )
        assert started.status_code == 202, started.text
        events_url = f"{url}/v1/workflow/{started.json()['task_id']}/events?user=u1"

        holders = [requests.get(events_url, headers=auth, stream=True, timeout=30) for _ in range(2)]
        assert [holder.status_code for holder in holders] == [200, 200]

        busy = requests.get(events_url, headers=auth, timeout=10)
        assert busy.status_code == 503, busy.text
        assert busy.json()["code"] == "event_stream_busy" and busy.json()["status"] == 503
        assert busy.headers["Retry-After"] == "1"
        # A streaming run refused the same way is failed at once, not left queued for the start deadline.
        refused = requests.post(
            f"{url}/v1/workflows/run",
            json={"inputs": {"name": "Fy"}, "user": "u1", "response_mode": "streaming"},
            headers=auth,
            timeout=10,
        )
        assert refused.status_code == 503 and refused.json()["code"] == "event_stream_busy", refused.text
        engine = sqlalchemy.create_engine(env["SQLALCHEMY_DATABASE_URI"])
        try:
            with engine.connect() as connection:
                status, error = connection.execute(
                    sqlalchemy.text("SELECT status, error FROM workflow_runs WHERE inputs_json LIKE '%Fy%'")
                ).one()
        finally:
            engine.dispose()
        assert status == "failed" and "could not be opened" in error

        # The two streams that hold the pool's connections still follow the run to its end ...
        for holder in holders:
            seen = [json.loads(line[5:])["event"] for line in holder.iter_lines() if line.startswith(b"data:")]
            holder.close()
            assert seen and seen[-1] == "workflow_finished", seen[-3:]
        # ... and once they have ended, their connections serve the next client (of a live run).
        second = requests.post(
            f"{url}/v1/workflows/run",
            json={"inputs": {"name": "Ed"}, "user": "u1", "response_mode": "async"},
            headers=auth,
            timeout=10,
        )
        later = requests.get(
            f"{url}/v1/workflow/{second.json()['task_id']}/events?user=u1", headers=auth, stream=True, timeout=30
        )
        assert later.status_code == 200, later.text
        seen = [json.loads(line[5:])["event"] for line in later.iter_lines() if line.startswith(b"data:")]
        later.close()
        assert seen[-1] == "workflow_finished"
        assert 500 not in stack.statuses()
