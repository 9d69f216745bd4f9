"""What keeps an event stream cheap: coalesced chunks, no timer per idle stream, one run watcher per process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from api.controllers.common.sse import PING, sse_chunk, sse_message
from api.core.app.apps import run_store
from api.core.app.apps.event_codec import encode_event
from api.core.app.apps.event_transport import StreamMessage
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, Closed, TopicCursor
from api.extensions.ext_durable_stream import durable_stream
from api.models import App, WorkflowRun
from api.models.engine import db
from api.services.delivery.reading import EventBatch, Notice, Ping, StreamEvent, StreamItem, read_alone
from api.services.delivery.watcher import run_watcher
from api.services.run_recovery import started_event_of
from harness.sse import parse_sse
from harness.waiting import wait_until
from tests.app.conftest import AppHarness
from tests.app.test_events_sse import events_of, reconnect, stream
from tests.app.test_run_always_ends import start_async


class FakeSubscription:
    """Records ready in a queue; ``receive`` returns one if there is one, else waits (recorded)."""

    resumable = True

    def __init__(self, records: list[bytes], *, close_after_waits: int = 1000) -> None:
        self.ready = [StreamMessage(payload, TopicCursor(f"c{index}")) for index, payload in enumerate(records)]
        self.timeouts: list[float] = []
        self.closed = False
        self._close_after_waits = close_after_waits

    def __enter__(self) -> FakeSubscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def receive(self, timeout: float) -> StreamMessage | Closed | None:
        if self.closed:
            return CLOSED
        if self.ready:
            return self.ready.pop(0)
        if timeout > 0:
            self.timeouts.append(timeout)
            if len(self.timeouts) >= self._close_after_waits:
                self.close()
                return CLOSED
        return None

    def close(self) -> None:
        self.closed = True


def event(name: str, text: str = "") -> bytes:
    return encode_event({"event": name, "task_id": "t", "workflow_run_id": "r", "data": {"text": text}})


def one_by_one(items: list[StreamItem]) -> bytes:
    """The bytes of ``items`` framed one message at a time (what clients received before coalescing)."""
    out = b""
    for item in items:
        for single in item.events if isinstance(item, EventBatch) else (item,):
            if isinstance(single, StreamEvent):
                event_id = None if single.cursor is None else f"token-{single.cursor}".encode()
                out += sse_message(single.payload, event_id=event_id)
            elif isinstance(single, Notice):
                out += sse_message(single.payload, event=single.event)
            else:
                out += PING
    return out


def frame(items: list[StreamItem]) -> list[bytes]:
    return [sse_chunk(item, lambda cursor: f"token-{cursor}".encode()) for item in items]


def test_events_ready_at_once_go_out_as_one_chunk_each_exactly_once() -> None:
    records = [event("text_chunk", str(index)) for index in range(150)] + [event("workflow_finished")]
    subscription = FakeSubscription(records)
    items = list(read_alone(subscription, coalesce=64))
    assert [type(item) for item in items] == [Ping, EventBatch, EventBatch, EventBatch]
    events = [event for item in items if isinstance(item, EventBatch) for event in item.events]
    assert [e.payload for e in events] == records, "every event once, in order"
    chunks = frame(items)
    assert b"".join(chunks) == one_by_one(items), "the same bytes as one message at a time"
    assert [len(list(parse_sse([chunk]))) for chunk in chunks] == [1, 64, 64, 23], "a ping, then bounded chunks"
    assert [m.json for m in parse_sse(chunks) if not m.is_ping] == [json.loads(e.payload) for e in events]


def test_a_lone_event_is_sent_at_once_and_a_failed_read_loses_nothing_read_before() -> None:
    class Failing(FakeSubscription):
        def receive(self, timeout: float) -> StreamMessage | Closed | None:
            if not self.ready:
                raise RuntimeError("the store went away")
            return super().receive(timeout)

    items = read_alone(Failing([event("text_chunk", "a"), event("text_chunk", "b")]), coalesce=64)
    assert isinstance(next(items), Ping)
    batch = next(items)
    assert isinstance(batch, EventBatch) and len(batch.events) == 2, "read before the failure: still sent"
    with pytest.raises(RuntimeError):
        next(items)
    trickle = FakeSubscription([event("text_chunk", "a")], close_after_waits=1)
    assert [type(item) for item in read_alone(trickle, coalesce=64)] == [Ping, StreamEvent]


def test_every_item_is_one_chunk_with_the_same_bytes() -> None:
    first = StreamEvent("text_chunk", event("text_chunk", "a"), TopicCursor("c1"))
    second = StreamEvent("text_chunk", b'{"event":"text_chunk","a":"b\nc"}', None)  # a raw newline: still correct
    items: list[StreamItem] = [first, EventBatch((first, second)), Notice("error", b'{"code":"x"}'), first]
    chunks = frame(items)
    assert len(chunks) == 4 and b"".join(chunks) == one_by_one(items)
    assert b'data: {"event":"text_chunk","a":"b\ndata: c"}\n\n' in chunks[1]


def test_an_idle_stream_waits_for_its_ping_not_a_poll_timer() -> None:
    subscription = FakeSubscription([event("text_chunk")], close_after_waits=3)
    items = list(read_alone(subscription, ping_interval=10.0, idle_timeout=300.0, coalesce=64))
    assert all(9.0 < timeout <= 10.0 for timeout in subscription.timeouts), subscription.timeouts
    assert [type(item) for item in items] == [Ping, StreamEvent], "the stream was closed: nothing more"


def test_a_closed_subscription_ends_with_the_event_left_for_it() -> None:
    subscription = FakeSubscription([event("workflow_started")], close_after_waits=1)
    final = {"event": "workflow_finished", "data": {"status": "failed"}}
    items = list(read_alone(subscription, on_closed=lambda: final))
    assert isinstance(items[-1], StreamEvent) and items[-1].payload == encode_event(final) and items[-1].cursor is None


def _running_run_of_a_dead_worker(harness: AppHarness, key: str) -> dict[str, str]:
    """A run a worker claimed with a lease it will never renew (the test lets the lease lapse)."""
    run = start_async(harness, key)  # queued; no worker takes it
    with harness.app.app_context():
        row = db.session.get(WorkflowRun, run["workflow_run_id"])
        assert row is not None
        app = db.session.get(App, row.app_id)
        assert app is not None
        durable_stream().topic(workflow_run_topic("workflow", row.id)).append(encode_event(started_event_of(app, row)))
        assert run_store.claim(row.id, row.attempt_id or "", 3600)
        db.session.remove()
    return run


@pytest.fixture
def dead_worker_harness(make_harness: Callable[..., AppHarness]) -> Iterator[tuple[AppHarness, str]]:
    harness = make_harness(start_worker=False, WORKFLOW_LEASE_TTL=1.5, SSE_PING_INTERVAL=5)
    yield harness, harness.create_app("greeting")["api_key"]


def test_one_watcher_ends_every_stream_of_a_run_whose_worker_died(dead_worker_harness: tuple[AppHarness, str]) -> None:
    harness, key = dead_worker_harness
    run = _running_run_of_a_dead_worker(harness, key)
    results: list[list[dict[str, Any]]] = []

    def read() -> None:
        results.append(events_of(stream(reconnect(harness, key, run["task_id"], "u1"))))

    readers = [threading.Thread(target=read) for _ in range(5)]
    for reader in readers:
        reader.start()
    with harness.app.app_context():
        watcher = run_watcher()
        wait_until(lambda: watcher.streams_of(run["workflow_run_id"]) == 5, 30, "the five streams to be watched")
        assert watcher.watched() == 1, "five streams of one run: one watched run"
        assert run_store.renew_lease(run["workflow_run_id"], -1), "the dead worker's lease lapses"
    for reader in readers:
        reader.join(timeout=30)
    assert len(results) == 5, "every stream ended"
    for events in results:
        assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"]
        assert events[-1]["data"]["status"] == "failed" and "lease expired" in events[-1]["data"]["error"]
    with harness.app.app_context():
        assert run_watcher().watched() == 0


def test_the_watcher_ends_live_only_streams_at_once_and_durable_ones_after_the_grace(
    make_harness: Callable[..., AppHarness],
) -> None:
    harness = make_harness(start_worker=False, WORKFLOW_END_RETRY_DEADLINE=0.5, WORKFLOW_LEASE_TTL=3)
    key = harness.create_app("greeting")["api_key"]
    run_id = start_async(harness, key)["workflow_run_id"]
    # The finisher recorded the outcome and died while it retried the end: nobody repairs it for an hour.
    with harness.app.app_context():
        assert run_store.finish(run_id, "failed", outputs=None, error="gone", steps=0, repair_after=time.time() + 3600)
        watcher = run_watcher()
        live_only, durable = FakeSubscription([]), FakeSubscription([])
        live_watch = watcher.watch(run_id, live_only, live_only=True)
        durable_watch = watcher.watch(run_id, durable, live_only=False)
    try:
        watcher.check()
        assert live_only.closed and live_watch.final_event() is not None
        assert live_watch.final_event()["data"]["status"] == "failed"  # type: ignore[index]
        assert not durable.closed and durable_watch.final_event() is None, "its end may still reach the topic"
        time.sleep(watcher.interval + 0.5 + 0.1)  # past the grace (end retry deadline + interval)
        watcher.check()
        assert durable.closed and durable_watch.final_event() == live_watch.final_event()
    finally:
        watcher.unwatch(live_watch)
        watcher.unwatch(durable_watch)
    assert watcher.watched() == 0


def test_open_streams_hold_no_database_connection(harness: AppHarness) -> None:
    """More open streams than the app's pool has connections, and the next request is still served at once.

    An open stream must not keep a pooled database connection: with 5 + 10 connections per worker, a
    stream that held one would make the 16th concurrent stream, and every later request, wait for the
    pool. (The run checks are the process's run watcher's, one query per pass.)
    """
    key = harness.create_app()["api_key"]
    paused = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Eve", "mood": "formal"}, "user": "u9"}).json
    assert paused["data"]["status"] == "paused"
    path = f"/v1/workflow/{paused['task_id']}/events?user=u9&continue_on_pause=true"
    began = threading.Semaphore(0)
    done = threading.Event()
    failures: list[BaseException] = []

    def hold_a_stream() -> None:  # each in its own thread: a request context per stream, as in a server
        try:
            response = harness.client.get(path, headers={"Authorization": f"Bearer {key}"}, buffered=False)
            try:
                assert response.status_code == 200
                next(iter(response.response))  # the stream has begun: its first ping is out
                began.release()
                done.wait(30)
            finally:
                response.close()
        except BaseException as exc:
            failures.append(exc)
            began.release()

    threads = [threading.Thread(target=hold_a_stream) for _ in range(20)]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert began.acquire(timeout=30)
        assert failures == []
        with harness.app.app_context():
            assert db.engine.pool.checkedout() <= 1, db.engine.pool.status()
        detail = harness.get(f"/v1/workflows/run/{paused['workflow_run_id']}?user=u9", key)
        assert detail.status_code == 200
    finally:
        done.set()
        for thread in threads:
            thread.join(30)
