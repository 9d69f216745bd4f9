"""Resumable SSE: streaming runs, Last-Event-ID, start positions, terminal rules, tokens and errors."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.core.app.apps.topics import workflow_run_topic
from api.extensions.ext_durable_stream import durable_stream
from api.models import WorkflowRun
from api.models.engine import db
from harness.hostile_target import FAST_WORKFLOW as FAST
from harness.sse import SseMessage, parse_sse
from tests.app.conftest import AppHarness
from tests.app.test_service_api import slow_greeting, wait_for_status


def stream(response: Any, limit: int | None = None) -> list[SseMessage]:
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.mimetype == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-cache" and response.headers["X-Accel-Buffering"] == "no"
    messages = []
    for message in parse_sse(response.response):
        messages.append(message)
        if limit is not None and len(messages) >= limit:
            break
    response.close()
    return messages


def events_of(messages: list[SseMessage]) -> list[dict[str, Any]]:
    return [m.json for m in messages if not m.is_ping]


def run_streaming(harness: AppHarness, key: str, inputs: dict[str, Any], user: str = "u1") -> list[SseMessage]:
    """A streaming run's messages; its ids come in the headers, and the first data event is its start."""
    response = harness.client.post(
        "/v1/workflows/run",
        json={"inputs": inputs, "user": user, "response_mode": "streaming"},
        headers={"Authorization": f"Bearer {key}"},
        buffered=False,
    )
    task_id, run_id = response.headers.get("X-Task-Id"), response.headers.get("X-Workflow-Run-Id")
    assert task_id and run_id
    messages = stream(response)
    assert messages[0].is_ping, "Dify's streams begin with a ping"
    data = [m for m in messages if not m.is_ping]
    assert data and data[0].event is None and data[0].json["event"] == "workflow_started", "no foreign first event"
    events = [m.json for m in data if m.event is None]
    assert all(e["task_id"] == task_id and e["workflow_run_id"] == run_id for e in events)
    return messages


def events_url(task_id: str, user: str, **params: str) -> str:
    """The events of a run; from its beginning unless ``include_state_snapshot`` says otherwise."""
    query = "&".join(f"{k}={v}" for k, v in {"user": user, "include_state_snapshot": "true", **params}.items())
    return f"/v1/workflow/{task_id}/events?{query}"


def reconnect(
    harness: AppHarness, key: str, task_id: str, user: str, last_event_id: str | None = None, **params: str
) -> Any:
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return harness.client.get(events_url(task_id, user, **params), headers=headers, buffered=False)


@pytest.fixture(scope="module")
def greeting(harness: AppHarness) -> dict[str, str]:
    return harness.create_app("greeting")


@pytest.fixture(scope="module")
def fast(harness: AppHarness) -> dict[str, str]:
    return harness.create_app(FAST)


def test_streaming_run_sends_a_ping_then_every_event_with_an_id(harness: AppHarness, greeting: dict[str, str]) -> None:
    messages = run_streaming(harness, greeting["api_key"], {"name": "Ada"})
    assert messages[0].is_ping and messages[0].id is None
    events = events_of(messages)
    assert events[0]["event"] == "workflow_started" and events[-1]["event"] == "workflow_finished"
    assert all(m.id for m in messages if not m.is_ping), "every event carries a resume token"
    assert len({m.id for m in messages if not m.is_ping}) == len(events)
    assert "".join(e["data"]["text"] for e in events if e["event"] == "text_chunk").startswith("Hello Ada!")
    stored = harness.events(events[0]["workflow_run_id"])
    assert events == stored, "the stream carries exactly the run's retained events"


def test_back_to_back_streaming_runs_never_miss_their_start(harness: AppHarness, fast: dict[str, str]) -> None:
    for index in range(200):
        events = events_of(run_streaming(harness, fast["api_key"], {"n": index}))
        assert events[0]["event"] == "workflow_started", f"run {index} lost its first event"
        assert events[-1]["event"] == "workflow_finished" and events[-1]["data"]["outputs"] == {"out": f"run {index}"}


def test_reconnect_without_last_event_id_replays_the_whole_retained_run(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    full = run_streaming(harness, key, {"name": "Bo"})
    task_id = events_of(full)[0]["task_id"]
    again = stream(reconnect(harness, key, task_id, "u1"))
    assert events_of(again) == events_of(full)


@pytest.mark.parametrize("via", ["header", "query"])
def test_last_event_id_resumes_strictly_after_that_event(
    harness: AppHarness, greeting: dict[str, str], via: str
) -> None:
    key = greeting["api_key"]
    full = [m for m in run_streaming(harness, key, {"name": "Cy"}) if not m.is_ping]
    task_id = full[0].json["task_id"]
    for cut in (0, 3, len(full) // 2, len(full) - 2):
        if via == "header":
            response = reconnect(harness, key, task_id, "u1", last_event_id=full[cut].id)
        else:
            response = reconnect(harness, key, task_id, "u1", last_event_id=full[cut].id)
            response.close()
            response = harness.client.get(
                events_url(task_id, "u1", last_event_id=full[cut].id or ""),
                headers={"Authorization": f"Bearer {key}"},
                buffered=False,
            )
        resumed = stream(response)
        assert resumed[0].is_ping
        assert events_of(resumed) == [m.json for m in full[cut + 1 :]]


def test_reconnecting_to_the_last_event_of_a_finished_run_ends_at_once(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    full = [m for m in run_streaming(harness, key, {"name": "Di"}) if not m.is_ping]
    resumed = stream(reconnect(harness, key, full[0].json["task_id"], "u1", last_event_id=full[-1].id))
    assert events_of(resumed) == []


def test_a_pause_ends_the_stream_unless_continue_on_pause(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    first = events_of(run_streaming(harness, key, {"name": "Eve", "mood": "formal"}, user="u2"))
    assert first[-1]["event"] == "workflow_paused"
    task_id, run_id = first[0]["task_id"], first[0]["workflow_run_id"]

    follower = reconnect(harness, key, task_id, "u2", continue_on_pause="true")
    messages = parse_sse(follower.response)
    seen: list[dict[str, Any]] = []
    for message in messages:
        if not message.is_ping:
            seen.append(message.json)
        if seen and seen[-1]["event"] == "workflow_paused":
            break
    assert (
        harness.post(
            f"/v1/workflows/runs/{run_id}/human-input", key, {"user": "u2", "inputs": {"approved": "true"}}
        ).status_code
        == 200
    )
    for message in messages:  # the same response goes on across the pause
        if not message.is_ping:
            seen.append(message.json)
    follower.close()
    assert seen[-1]["event"] == "workflow_finished" and seen[-1]["data"]["status"] == "succeeded"
    assert seen == harness.events(run_id)


def test_a_stale_pause_in_history_does_not_end_a_replay(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    first = events_of(run_streaming(harness, key, {"name": "Fay", "mood": "formal"}, user="u3"))
    task_id, run_id = first[0]["task_id"], first[0]["workflow_run_id"]
    assert (
        harness.post(
            f"/v1/workflows/runs/{run_id}/human-input", key, {"user": "u3", "inputs": {"approved": "true"}}
        ).status_code
        == 200
    )
    wait_for_status(harness, key, run_id, "u3", {"succeeded"})
    replay = events_of(stream(reconnect(harness, key, task_id, "u3")))
    assert [e["event"] for e in replay].count("workflow_paused") == 1
    assert replay[-1]["event"] == "workflow_finished"


def test_a_finished_run_whose_events_aged_out_gets_one_finished_event_from_the_row(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    events = events_of(run_streaming(harness, key, {"name": "Gus"}))
    run_id = events[0]["workflow_run_id"]
    with harness.app.app_context():
        durable_stream().admin.delete_topic(workflow_run_topic("workflow", run_id))
        # As retention would have removed it: the run ended longer ago than the stream store keeps events.
        run = db.session.get(WorkflowRun, run_id)
        run.finished_at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=8)
        db.session.commit()
        db.session.remove()
    only = stream(reconnect(harness, key, run_id, "u1"))
    assert [m.is_ping for m in only] == [True, False] and only[1].id is None
    finished = only[1].json
    assert finished["event"] == "workflow_finished" and finished["data"]["status"] == "succeeded"
    assert finished["data"]["outputs"] == events[-1]["data"]["outputs"]
    assert finished["data"]["total_tokens"] == events[-1]["data"]["total_tokens"] > 0


def test_a_snapshot_of_a_finished_run_whose_events_were_lost_is_410_every_time(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    events = events_of(run_streaming(harness, key, {"name": "Gil"}))
    run_id = events[0]["workflow_run_id"]
    with harness.app.app_context():  # a FLUSHDB, or a restart of a store without persistence
        durable_stream().admin.delete_topic(workflow_run_topic("workflow", run_id))
    for _ in range(2):
        gone = reconnect(harness, key, run_id, "u1")
        assert gone.status_code == 410 and gone.json["code"] == "run_events_lost"
        assert gone.json["run"]["id"] == run_id and gone.json["run"]["status"] == "succeeded"
    # Without a snapshot the client asked only for what comes next: the run's end, from its row.
    only = events_of(stream(reconnect(harness, key, run_id, "u1", include_state_snapshot="false")))
    assert [e["event"] for e in only] == ["workflow_finished"]


def test_without_a_snapshot_a_reader_starts_at_the_tail_with_ids(harness: AppHarness) -> None:
    key = harness.create_app(slow_greeting(delay=0.02, tokens=150))["api_key"]
    started = harness.post(
        "/v1/workflows/run", key, {"inputs": {"name": "Tia"}, "user": "u1", "response_mode": "async"}
    ).json
    run_id = started["workflow_run_id"]
    deadline = time.monotonic() + 20
    while sum(e["event"] == "text_chunk" for e in harness.events(run_id)) < 5:
        assert time.monotonic() < deadline, "the run never streamed"
        time.sleep(0.02)
    retained_before = len(harness.events(run_id))
    tail = [m for m in stream(reconnect(harness, key, run_id, "u1", include_state_snapshot="false")) if not m.is_ping]
    names = [m.json["event"] for m in tail]
    assert names[0] != "workflow_started" and names[-1] == "workflow_finished"
    assert all(m.id for m in tail), "a stream that starts at the tail can still be resumed"
    stored = harness.events(run_id)
    assert [m.json for m in tail] == stored[len(stored) - len(tail) :], "the tail is the run's latest events"
    assert len(stored) - len(tail) >= retained_before, "nothing from before the request is replayed"
    # The task id names the run as well as its own id does.
    by_task = events_of(stream(reconnect(harness, key, started["task_id"], "u1", include_state_snapshot="false")))
    assert [e["event"] for e in by_task] == ["workflow_finished"]


def test_resume_token_errors(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    run_a = [m for m in run_streaming(harness, key, {"name": "Hal"}) if not m.is_ping]
    run_b = [m for m in run_streaming(harness, key, {"name": "Ida"}) if not m.is_ping]
    task_a = run_a[0].json["task_id"]
    token = run_a[2].id or ""
    tampered = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    for bad in ("garbage", "", "x" * 3000, tampered, run_b[2].id or "", token[:20]):
        response = reconnect(harness, key, task_a, "u1", last_event_id=bad)
        if bad == "":
            response.close()  # an empty id is no id: the whole run is replayed
            continue
        assert response.status_code == 400, bad
        assert response.json["code"] == "invalid_resume_token" and response.json["status"] == 400
    other_key = harness.create_app("greeting")["api_key"]
    assert reconnect(harness, other_key, task_a, "u1", last_event_id=token).status_code == 404
    assert reconnect(harness, key, task_a, "intruder", last_event_id=token).status_code == 404
    assert harness.client.get(events_url(task_a, "u1")).status_code == 401


def test_a_token_from_an_unknown_key_is_refused(make_harness: Callable[..., AppHarness]) -> None:
    first = make_harness(start_worker=True, SECRET_KEY="secret-one-" + "1" * 32)
    key = first.create_app("greeting")["api_key"]
    messages = [m for m in run_streaming(first, key, {"name": "Jo"}) if not m.is_ping]
    rotated_env = {**first.env, "SECRET_KEY": "secret-two-" + "2" * 32}
    second = AppHarness(rotated_env, None)
    try:
        response = reconnect(second, key, messages[0].json["task_id"], "u1", last_event_id=messages[1].id)
        assert response.status_code == 400 and response.json["code"] == "invalid_resume_token"
    finally:
        second.close()


def test_an_expired_cursor_is_410(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    messages = [m for m in run_streaming(harness, key, {"name": "Kim"}) if not m.is_ping]
    run_id, task_id = messages[0].json["workflow_run_id"], messages[0].json["task_id"]
    with harness.app.app_context():
        durable_stream().admin.trim_topic(workflow_run_topic("workflow", run_id), keep_last=2)
    response = reconnect(harness, key, task_id, "u1", last_event_id=messages[1].id)
    assert response.status_code == 410
    assert response.json["code"] == "resume_cursor_expired" and "reload" in response.json["message"]
    still_retained = stream(reconnect(harness, key, task_id, "u1", last_event_id=messages[-3].id))
    assert events_of(still_retained) == [m.json for m in messages[-2:]]


def test_a_dead_workers_clients_receive_the_failed_end(make_harness: Callable[..., AppHarness]) -> None:
    idle_timeout = 60
    harness = make_harness(WORKFLOW_LEASE_TTL=2, SSE_PING_INTERVAL=0.5, SSE_IDLE_TIMEOUT=idle_timeout)
    key = harness.create_app(slow_greeting(delay=0.05, tokens=2000))["api_key"]
    response = harness.client.post(
        "/v1/workflows/run",
        json={"inputs": {"name": "Lee"}, "user": "u1", "response_mode": "streaming"},
        headers={"Authorization": f"Bearer {key}"},
        buffered=False,
    )
    seen: list[SseMessage] = []
    started = None
    for message in parse_sse(response.response):
        seen.append(message)
        if started is None and not message.is_ping and message.json["event"] == "text_chunk":
            assert harness.worker is not None
            harness.worker.kill()
            started = time.monotonic()
    response.close()
    assert started is not None
    # Ended by the expired lease (2 s), not left to the idle timeout.
    assert time.monotonic() - started < idle_timeout / 2, "the idle loop did not notice the expired lease"
    last = events_of(seen)[-1]
    assert last["event"] == "workflow_finished" and last["data"]["status"] == "failed"
    assert any(m.is_ping for m in seen[1:]), "pings kept the idle connection alive"


def test_web_app_passport_run_and_resume(harness: AppHarness) -> None:
    created = harness.create_app(FAST)
    passport = harness.client.get("/api/passport", headers={"X-App-Code": created["site_code"]}).json
    auth = {"Authorization": f"Bearer {passport['access_token']}"}
    response = harness.client.post(
        "/api/workflows/run", json={"inputs": {"n": 1}, "response_mode": "streaming"}, headers=auth, buffered=False
    )
    full = [m for m in stream(response) if not m.is_ping]
    task_id = full[0].json["task_id"]
    resumed = stream(
        harness.client.get(
            f"/api/workflow/{task_id}/events", headers={**auth, "Last-Event-ID": full[0].id or ""}, buffered=False
        )
    )
    assert events_of(resumed) == [m.json for m in full[1:]]
    other = harness.client.get("/api/passport", headers={"X-App-Code": created["site_code"]}).json
    assert (
        harness.client.get(
            f"/api/workflow/{task_id}/events", headers={"Authorization": f"Bearer {other['access_token']}"}
        ).status_code
        == 404
    )
    assert harness.client.get("/api/passport", headers={"X-App-Code": "nope"}).status_code == 404
    assert (
        harness.client.get(f"/api/workflow/{task_id}/events", headers={"Authorization": "Bearer forged"}).status_code
        == 401
    )


@pytest.fixture(scope="module")
def finished_run(harness: AppHarness, fast: dict[str, str]) -> tuple[str, str]:
    events = events_of(run_streaming(harness, fast["api_key"], {"n": "fuzz"}))
    return fast["api_key"], events[0]["task_id"]


_header_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
    st.binary(min_size=0, max_size=200).map(lambda b: __import__("base64").urlsafe_b64encode(b).decode().rstrip("=")),
    st.binary(min_size=30, max_size=120).map(
        lambda b: __import__("base64").urlsafe_b64encode(bytes([1, 3]) + b"dev" + b).decode()
    ),
)


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(value=_header_values)
def test_fuzzed_last_event_id_never_causes_a_5xx(
    harness: AppHarness, finished_run: tuple[str, str], value: str
) -> None:
    key, task_id = finished_run
    response = harness.client.get(
        events_url(task_id, "u1"), headers={"Authorization": f"Bearer {key}", "Last-Event-ID": value}, buffered=False
    )
    try:
        assert response.status_code in (200, 400), response.status_code
        if response.status_code == 400:
            assert response.json["code"] == "invalid_resume_token"
    finally:
        response.close()


def test_an_idle_stream_pings_and_ends_after_the_idle_timeout(make_harness: Callable[..., AppHarness]) -> None:
    idle_timeout, ping_interval = 3.0, 0.3
    harness = make_harness(SSE_IDLE_TIMEOUT=idle_timeout, SSE_PING_INTERVAL=ping_interval)
    key = harness.create_app("greeting")["api_key"]
    paused = [m for m in run_streaming(harness, key, {"name": "Ola", "mood": "formal"}) if not m.is_ping]
    assert paused[-1].json["event"] == "workflow_paused"
    started = time.monotonic()
    waiting = stream(
        reconnect(harness, key, paused[-1].json["task_id"], "u1", last_event_id=paused[-1].id, continue_on_pause="true")
    )
    elapsed = time.monotonic() - started
    # About ten pings in the idle timeout; four leave room for a busy machine's late ones.
    assert all(m.is_ping for m in waiting) and len(waiting) >= 4, "a ping at once, then one every ping interval"
    assert idle_timeout <= elapsed < 4 * idle_timeout, elapsed
