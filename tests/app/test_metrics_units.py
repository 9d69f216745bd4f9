"""The pieces of the metrics, in one process: the library's observer hooks, the event envelope and the
publisher that turns the app's tallies into Prometheus metrics."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Histogram

from api.core.app.apps.event_codec import encode_event, stamp_of, stamped, unstamped
from api.core.app.apps.event_transport import DurableEventTransport
from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamRecord,
    DurableStreamUnavailableError,
    TopicCursor,
    TopicSealedError,
    connect,
    set_observer,
)
from api.extensions.ext_metrics import Publisher
from api.libs import metrics


class Recorder:
    """An observer that keeps every call (the app's real one counts; this one remembers)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[tuple[object, ...]] = collections.Counter()
        self.backlogs: list[tuple[str, int]] = []

    def appended(self, backend: str, outcome: str, seconds: float) -> None:
        assert seconds >= 0
        self.calls["appended", backend, outcome] += 1

    def records_read(self, backend: str, count: int) -> None:
        self.calls["read", backend] += count

    def subscription_opened(self, backend: str) -> None:
        self.calls["open", backend] += 1

    def subscription_started(self, backend: str, start: str, backlog: int) -> None:
        self.backlogs.append((start, backlog))

    def subscription_closed(self, backend: str) -> None:
        self.calls["close", backend] += 1

    def cursor_unavailable(self, backend: str, reason: str) -> None:
        self.calls["cursor", backend, reason] += 1

    def unavailable(self, backend: str) -> None:
        self.calls["unavailable", backend] += 1


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    observer = Recorder()
    set_observer(observer)
    try:
        yield observer
    finally:
        set_observer(None)


def test_the_library_reports_appends_reads_subscriptions_and_each_kind_of_lost_cursor(recorder: Recorder) -> None:
    with connect("memory://") as backend:
        topic = backend.topic("t")
        for index in range(5):
            topic.append(b"%d" % index)
        with topic.subscribe_from_beginning() as subscription:
            first = subscription.receive(timeout=1)
            assert isinstance(first, DurableStreamRecord)
        with topic.subscribe_from_cursor(first.cursor) as subscription:
            while (record := subscription.receive(timeout=0)) is not None:
                assert record is not CLOSED
        assert recorder.backlogs == [("beginning", 5), ("cursor", 4)]
        assert recorder.calls["appended", "memory", "ok"] == 5 and recorder.calls["read", "memory"] == 9
        assert recorder.calls["open", "memory"] == recorder.calls["close", "memory"] == 2

        backend.admin.trim_topic("t", 1)
        with pytest.raises(CursorUnavailableError) as trimmed, topic.subscribe_from_cursor(first.cursor):
            pass
        assert trimmed.value.reason == "trimmed"
        with pytest.raises(CursorUnavailableError) as foreign:
            backend.topic("other").subscribe_from_cursor(first.cursor)
        with pytest.raises(CursorUnavailableError) as malformed:
            topic.subscribe_from_cursor(TopicCursor("1.nonsense"))
        backend.admin.delete_topic("t")
        topic.append(b"new incarnation")
        with pytest.raises(CursorUnavailableError) as epoch, topic.subscribe_from_cursor(first.cursor):
            pass
        assert (foreign.value.reason, malformed.value.reason, epoch.value.reason) == ("foreign", "malformed", "epoch")
        for reason in ("trimmed", "foreign", "malformed", "epoch"):
            assert recorder.calls["cursor", "memory", reason] == 1, reason

        topic.seal()
        with pytest.raises(TopicSealedError):
            topic.append(b"late")
        assert recorder.calls["appended", "memory", "sealed"] == 1
        assert recorder.calls["open", "memory"] == recorder.calls["close", "memory"] == 4
        assert recorder.calls["unavailable", "memory"] == 0
    with pytest.raises(DurableStreamUnavailableError), backend.topic("t").subscribe_from_beginning():
        pass
    assert recorder.calls["unavailable", "memory"] == 1, "a closed backend is unavailable"


def test_without_an_observer_a_backend_reports_nothing_and_keeps_nothing_for_it() -> None:
    set_observer(None)
    with connect("memory://") as backend:
        topic = backend.topic("t")
        topic.append(b"x")
        subscription = topic.subscribe_from_beginning()
        assert not hasattr(subscription, "_kind")
        with subscription:
            assert isinstance(subscription.receive(timeout=1), DurableStreamRecord)


def test_a_failing_observer_changes_nothing_for_the_caller() -> None:
    class Broken(Recorder):
        def appended(self, backend: str, outcome: str, seconds: float) -> None:
            raise RuntimeError("observer bug")

        def records_read(self, backend: str, count: int) -> None:
            raise RuntimeError("observer bug")

    set_observer(Broken())
    try:
        with connect("memory://") as backend:
            backend.topic("t").append(b"x")
            with backend.topic("t").subscribe_from_beginning() as subscription:
                assert isinstance(subscription.receive(timeout=1), DurableStreamRecord)
    finally:
        set_observer(None)


def test_the_envelope_is_stored_but_never_part_of_the_payload_a_reader_gets() -> None:
    payload = encode_event({"event": "text_chunk", "data": {"text": "hi"}})
    stored = stamped(payload)
    assert stored.startswith(b"\x1e") and unstamped(stored) == payload and unstamped(payload) == payload
    stamp = stamp_of(stored)
    assert stamp is not None and abs(stamp - __import__("time").time()) < 5
    assert stamp_of(payload) is None and stamp_of(b"\x1enot a number!!!!!{}") is None
    with connect("memory://") as backend:
        transport = DurableEventTransport(backend)
        transport.topic("t").append(stored)
        transport.topic("t").append(payload)  # written before the envelope existed
        with transport.subscribe_resume("t", None) as subscription:
            first, second = subscription.receive(timeout=1), subscription.receive(timeout=1)
        assert not isinstance(first, type(CLOSED)) and first is not None and second is not None
        assert not isinstance(second, type(CLOSED))
        assert (first.payload, first.stored) == (payload, stored)
        assert (second.payload, second.stored) == (payload, None)
        assert transport.last_payload("t") == payload


def test_publishing_a_histograms_counts_at_once_equals_observing_each_value() -> None:
    values = [0.0004, 0.003, 0.003, 0.2, 7.0, 42.0]
    for metric in metrics.METRICS:
        metric.tally.reset()
    registry = CollectorRegistry()
    publisher = Publisher(registry)
    reference = Histogram("reference", "r", ["transport"], buckets=metrics.LAG_BUCKETS, registry=CollectorRegistry())
    for value in values[:3]:
        metrics.LAG.tally.observe(("durable_stream",), value)
        reference.labels("durable_stream").observe(value)
    publisher.publish()
    for value in values[3:]:
        metrics.LAG.tally.observe(("durable_stream",), value)
        reference.labels("durable_stream").observe(value)
    metrics.RESUMES.tally.add(("resume_cursor_expired",), 2)
    publisher.publish()
    publisher.publish()  # nothing new: nothing added twice

    def samples(collected: Iterator[object], prefix: str) -> dict[tuple[str, str], float]:
        return {
            (sample.name.removeprefix(prefix), sample.labels.get("le", "")): sample.value  # type: ignore[attr-defined]
            for family in collected
            for sample in family.samples  # type: ignore[attr-defined]
            # The other transport's samples are there too, at 0 (known labels start at 0).
            if not sample.name.endswith("_created")  # type: ignore[attr-defined]
            and sample.labels.get("transport") == "durable_stream"  # type: ignore[attr-defined]
        }

    ours = samples(iter(publisher_lag(registry)), "workflow_event_delivery_lag_seconds")
    theirs = samples(iter(reference.collect()), "reference")
    assert ours == theirs and ours[("_count", "")] == len(values)
    assert registry.get_sample_value("workflow_sse_resumes_total", {"outcome": "resume_cursor_expired"}) == 2
    # Known labels are exported before anything happened to them.
    assert registry.get_sample_value("workflow_sse_resumes_total", {"outcome": "run_events_lost"}) == 0


def publisher_lag(registry: CollectorRegistry) -> list[object]:
    return [family for family in registry.collect() if family.name == "workflow_event_delivery_lag_seconds"]


def test_a_watchdog_stop_is_counted_and_a_manual_abort_is_not() -> None:
    import time

    from api.core.app.apps.execution_coordinator import AppExecutionCoordinator, RunIdentity
    from harness.waiting import wait_until

    run = RunIdentity(app_id="app", task_id="task", workflow_run_id="run", created_at=time.time())
    before = metrics.WATCHDOG_STOPS.tally.snapshot().get((), [0.0])[0]
    with connect("memory://") as backend:
        transport = DurableEventTransport(backend)
        manual = AppExecutionCoordinator(
            transport=transport, topic_name="a", run=run, max_execution_time=60, stop_requested=lambda: False
        )
        manual.request_abort("stopped by user")
        timed = AppExecutionCoordinator(
            transport=transport, topic_name="b", run=run, max_execution_time=0.1, stop_requested=lambda: False
        )
        timed.start()
        wait_until(lambda: timed.should_stop() is not None, 5, "the watchdog to fire", interval=0.01)
    assert metrics.WATCHDOG_STOPS.tally.snapshot()[()][0] == before + 1
