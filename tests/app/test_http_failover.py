"""A streaming run across a real failover of its stream store: the primary dies with the run's last
events unreplicated, the replica is promoted, and the run (a real Celery worker) goes on there. Every
reconnect (``Last-Event-ID`` before and after the fork, a snapshot) is exact or an explicit 410, and
the run ends: never a 200 that silently skips, repeats or invents events.

The store is a private Redis primary with a replica behind a freezable replication link, and the
app reaches it through a movable relay (``harness.failover``) or through three Redis Sentinels
(``harness.sentinel_failover``); the broker and the app database are the test's own, untouched by the
failover.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import requests

from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, connect
from harness.app_env import base_env
from harness.failover import RedisFailover
from harness.sentinel_failover import RedisSentinelFailover
from harness.served_stack import ServedStack
from harness.sse import parse_sse
from harness.sse_client import read_run
from harness.waiting import wait_until
from tests.app.test_service_api import slow_greeting

pytestmark = pytest.mark.timeout(240)

DELAY = 0.05  # seconds between the run's text chunks
GONE = {"history_diverged", "run_events_lost", "resume_cursor_expired"}


def stored(url: str, run_id: str) -> list[dict[str, Any]]:
    """What the store holds of the run now (without waiting for more)."""
    events = []
    with (
        connect(url) as backend,
        backend.topic(workflow_run_topic("workflow", run_id)).subscribe_from_beginning() as sub,
    ):
        while (record := sub.receive(timeout=0)) not in (None, CLOSED):
            events.append(json.loads(unstamped(record.payload)))  # type: ignore[union-attr]
    return events


def first_events(url: str, key: str, task_id: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """The run's first ``count`` events with their ids, read from its start, then let go."""
    found: list[tuple[str, dict[str, Any]]] = []
    events_url = f"{url}/v1/workflow/{task_id}/events?user=u1&include_state_snapshot=true&continue_on_pause=true"
    with requests.get(events_url, headers={"Authorization": f"Bearer {key}"}, stream=True, timeout=30) as response:
        assert response.status_code == 200, response.text
        for message in parse_sse(response.iter_content(None)):
            if message.is_ping or message.event is not None:
                continue
            found.append((message.id or "", message.json))
            if len(found) == count:
                break
    return found


def exact_or_gone(connection: Any, expected: list[dict[str, Any]]) -> str:
    """A reconnect's outcome: ``exact`` (what it received is ``expected``, to the run's end) or the 410's code."""
    if connection.status == 410:
        assert connection.error is not None and connection.error["code"] in GONE, connection.error
        return str(connection.error["code"])
    assert connection.status == 200 and connection.ended == "finished", (connection.status, connection.ended)
    received = [event.event for event in connection.events]
    assert received == expected, "a 200 that is not exactly the run after the client's position"
    return "exact"


# The promotion by an operator's tooling (REPLICAOF NO ONE, the app's address moved by a relay), or by
# Redis Sentinel (the app names the sentinels, as Dify's REDIS_USE_SENTINEL deployments do).
@pytest.mark.parametrize("failover", [RedisFailover, RedisSentinelFailover], ids=["promoted", "sentinel"])
def test_a_streaming_run_across_a_store_failover_resumes_exactly_or_410(
    tmp_path: pathlib.Path, failover: type[RedisFailover | RedisSentinelFailover]
) -> None:
    with failover() as pair:
        env = base_env(tmp_path, DURABLE_STREAM_URL=pair.url, WORKFLOW_LEASE_TTL="10")
        with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=2) as served:
            key = served.create_app(slow_greeting(delay=DELAY, tokens=400))  # about 20 s of text
            url = served.urls[0]
            run = requests.post(
                f"{url}/v1/workflows/run",
                json={"inputs": {"name": "Fo"}, "user": "u1", "response_mode": "async"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            ).json()
            task_id, run_id = run["task_id"], run["workflow_run_id"]
            wait_until(lambda: len(stored(pair.url, run_id)) > 30, 60, "the run to stream")
            # A reader holds an id from before the fork: replicated.
            before = first_events(url, key, task_id, 10)
            pair.wait_replicated()
            pair.freeze_replication()
            replicated = len(stored(pair.url, run_id))
            # The run appends more that only the primary has; a reader gets an id from among them.
            wait_until(lambda: len(stored(pair.url, run_id)) >= replicated + 5, 30, "unreplicated appends")
            assert pair.replica_behind()
            forked = first_events(url, key, task_id, replicated + 3)
            pair.fail_over()

            # The run goes on (or ends) on the promoted replica, and its end is there.
            def ended() -> bool:
                row = served.run_row(run_id) or {}
                events = stored(pair.url, run_id)
                return (
                    row.get("status") in ("succeeded", "failed")
                    and bool(events)
                    and (events[-1]["event"] == "workflow_finished")
                )

            wait_until(ended, 120, "the run to end on the promoted store")
            final = stored(pair.url, run_id)
            outcomes = []
            for held_events in (before, forked):
                count = len(held_events)
                last_id, held = held_events[-1]
                resumed = read_run(url, key, task_id, last_event_id=last_id)
                # Exact means: what the store now holds after the event the client last received, if
                # that event is still the one at its position (the producer repaired the history).
                expected = final[count:] if count <= len(final) and final[count - 1] == held else None
                if expected is None:
                    assert resumed.status == 410, "the client's event is not in the store: only 410 is right"
                outcomes.append(exact_or_gone(resumed, expected or []))
            snapshot = read_run(url, key, task_id, include_state_snapshot=True)
            outcomes.append(exact_or_gone(snapshot, final))
            assert outcomes[0] == "exact", "an id the replica had must resume exactly"
            # The client that held unreplicated events resumes exactly when the worker's producer put back
            # what the store lost (it did when its appends went on at once, through the relay), or is told
            # history_diverged when the run's end was written without them (through Sentinel the worker's
            # appends fail while the sentinels elect, and the run ends as failed); never a silent fork.
            assert len(forked) > replicated, "the second client must hold events the replica lacked"
            assert outcomes[1] in ("exact", "history_diverged"), outcomes
            assert 500 not in served.statuses()
