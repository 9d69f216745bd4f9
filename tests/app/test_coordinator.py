"""AppExecutionCoordinator against real durable streams (SQLite; a private Redis that is killed and restarted):
sealing rules, the failed end, and an end that is retried or left pending while the store is away."""

from __future__ import annotations

import itertools
import json
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.event_transport import DurableEventTransport
from api.core.app.apps.execution_coordinator import (
    AppExecutionCoordinator,
    AppExecutionState,
    RunIdentity,
    RunTakenOverError,
)
from api.core.app.apps.run_end import write_end
from api.core.durable_stream import (
    CLOSED,
    DurableStreamBackend,
    DurableStreamTopic,
    DurableStreamUnavailableError,
    TopicSealedError,
    connect,
)
from api.core.workflow.events import make_event
from harness.redis_server import RedisServer
from harness.waiting import wait_until

TOPIC = "workflow:workflow_run:run"
RUN = RunIdentity(app_id="app", task_id="task", workflow_run_id="run", created_at=time.time())
#: How long the coordinator retries writing an end before it leaves it pending (the test of that deadline).
END_DEADLINE = 0.5


@pytest.fixture
def backend(tmp_path: pathlib.Path) -> Iterator[DurableStreamBackend]:
    with connect(f"sqlite:///{tmp_path / 'streams.db'}") as backend:
        yield backend


@pytest.fixture
def topic(backend: DurableStreamBackend) -> DurableStreamTopic:
    return backend.topic(TOPIC)


def event(name: str, **data: Any) -> dict[str, Any]:
    return make_event(name, task_id="task", workflow_run_id="run", data=data)


def read_all(topic: DurableStreamTopic) -> tuple[list[dict[str, Any]], bool]:
    """All events, and whether the stream ended (sealed) rather than just ran dry."""
    events = []
    with topic.subscribe_from_beginning() as subscription:
        while True:
            record = subscription.receive(timeout=0.2)
            if record is CLOSED:
                return events, True
            if record is None:
                return events, False
            events.append(json.loads(unstamped(record.payload)))


@pytest.fixture
def transport(backend: DurableStreamBackend) -> DurableEventTransport:
    return DurableEventTransport(backend)


def coordinator(transport: DurableEventTransport, **kwargs: Any) -> AppExecutionCoordinator:
    kwargs.setdefault("max_execution_time", 60)
    kwargs.setdefault("stop_requested", lambda: False)
    return AppExecutionCoordinator(transport=transport, topic_name=TOPIC, run=RUN, **kwargs)


def test_terminal_event_is_appended_then_the_topic_sealed(
    topic: DurableStreamTopic, transport: DurableEventTransport
) -> None:
    ended: list[str] = []
    c = coordinator(transport, before_end=lambda e: ended.append(e["data"]["status"]) or True)
    c.start()
    c.publish(event("workflow_started"))
    c.publish(event("workflow_finished", status="succeeded", outputs={}, error=None))
    assert c.finish() is False
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed
    assert ended == ["succeeded"] and c.state is AppExecutionState.TERMINAL
    with pytest.raises(TopicSealedError):
        topic.append(b"late")


def test_pause_is_appended_without_sealing(topic: DurableStreamTopic, transport: DurableEventTransport) -> None:
    c = coordinator(transport)
    c.publish(event("workflow_started"))
    c.publish(event("workflow_paused", paused_node_id="approve"))
    assert c.finish() is False and c.state is AppExecutionState.PAUSED
    events, sealed = read_all(topic)
    assert events[-1]["event"] == "workflow_paused" and not sealed
    resumed = coordinator(transport, started_sent=True)  # a resumed attempt continues on the same topic
    resumed.publish(event("workflow_finished", status="succeeded", outputs={}, error=None))
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_paused", "workflow_finished"] and sealed


def test_an_attempt_without_a_terminal_event_ends_failed_and_sealed(
    topic: DurableStreamTopic, transport: DurableEventTransport
) -> None:
    c = coordinator(transport)
    c.publish(event("workflow_started"))
    c.publish(event("node_started", node_id="draft"))
    assert c.finish("internal error: boom") is True
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "node_started", "workflow_finished"] and sealed
    assert events[-1]["data"]["status"] == "failed" and events[-1]["data"]["error"] == "internal error: boom"


def test_a_failure_before_any_event_sends_a_synthetic_start_first(
    topic: DurableStreamTopic, transport: DurableEventTransport
) -> None:
    c = coordinator(transport)
    assert c.finish("worker crashed") is True
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed


def test_watchdog_requests_an_abort(topic: DurableStreamTopic, transport: DurableEventTransport) -> None:
    aborted: list[str] = []
    c = coordinator(transport, max_execution_time=0.2, on_abort=aborted.append, stop_check_interval=0)
    c.start()
    wait_until(c.should_stop, 5, "the watchdog to request an abort", interval=0.01)
    assert "timed out" in (c.should_stop() or "") and c.state is AppExecutionState.ABORTING
    assert len(aborted) == 1


def test_stop_flag_is_checked_at_most_once_per_interval(
    topic: DurableStreamTopic, transport: DurableEventTransport
) -> None:
    checks: list[float] = []

    def stop_requested() -> bool:
        checks.append(time.monotonic())
        return len(checks) >= 3

    c = coordinator(transport, stop_requested=stop_requested, stop_check_interval=0.05)
    # Asked far more often than the interval: the flag itself must be read at most once per interval.
    wait_until(c.should_stop, 5, "the stop flag to be read", interval=0.001)
    assert c.should_stop() == "stopped by user"
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(checks))


def test_a_topic_sealed_by_someone_else_takes_the_run_over(
    topic: DurableStreamTopic, transport: DurableEventTransport
) -> None:
    c = coordinator(transport)
    c.publish(event("workflow_started"))
    topic.seal()  # e.g. the API's lease check ended the run
    with pytest.raises(RunTakenOverError):
        c.publish(event("node_started"))
    assert c.finish() is False


@pytest.fixture
def redis_store() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


def test_the_end_is_retried_until_the_store_is_back(redis_store: RedisServer) -> None:
    with connect(redis_store.url) as backend:
        transport = DurableEventTransport(backend)
        stream_ended: list[bool] = []
        c = coordinator(transport, on_stream_ended=lambda info: stream_ended.append(True), end_deadline=30)
        c.publish(event("workflow_started"))
        redis_store.kill()
        # Published from another thread: the server must be restarted by this one, which it dies with.
        publishing = threading.Thread(
            target=c.publish, args=(event("workflow_finished", status="succeeded", outputs={}, error=None),)
        )
        publishing.start()
        time.sleep(0.5)  # the outage itself
        redis_store.start()
        publishing.join(timeout=30)
        assert not publishing.is_alive()
        events, sealed = read_all(backend.topic(TOPIC))
        assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed
        assert stream_ended == [True] and c.state is AppExecutionState.TERMINAL


def test_an_end_not_written_by_the_deadline_is_left_pending(redis_store: RedisServer) -> None:
    with connect(redis_store.url) as backend:
        transport = DurableEventTransport(backend)
        stream_ended: list[bool] = []
        recorded: list[str] = []
        c = coordinator(
            transport,
            before_end=lambda e: recorded.append(e["data"]["status"]) or True,
            on_stream_ended=lambda info: stream_ended.append(True),
            end_deadline=END_DEADLINE,
        )
        c.publish(event("workflow_started"))
        redis_store.kill()
        started = time.monotonic()
        c.publish(event("workflow_finished", status="succeeded", outputs={}, error=None))
        assert time.monotonic() - started < 10 * END_DEADLINE, "the end gave up at its deadline"
        assert recorded == ["succeeded"], "the row holds the outcome"
        assert stream_ended == [] and c.state is AppExecutionState.TERMINAL
        redis_store.start()
        assert not transport.topic_info(TOPIC).sealed, "end pending"
        finished = event("workflow_finished", status="succeeded", outputs={}, error=None)
        write_end(transport, TOPIC, finished, event("workflow_started"))
        write_end(transport, TOPIC, finished, event("workflow_started"))  # a second repairer changes nothing
        events, sealed = read_all(backend.topic(TOPIC))
        assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed


def test_a_repair_after_an_unacknowledged_append_does_not_repeat_the_end(
    topic: DurableStreamTopic, transport: DurableEventTransport
) -> None:
    topic.append(json.dumps(event("workflow_started")).encode())
    finished = event("workflow_finished", status="failed", outputs=None, error="boom")
    topic.append(json.dumps(finished).encode())  # stored, but its writer never heard back
    write_end(transport, TOPIC, finished, event("workflow_started"))
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed


def test_a_run_that_never_started_gets_a_start_before_its_end(
    topic: DurableStreamTopic, transport: DurableEventTransport
) -> None:
    write_end(transport, TOPIC, event("workflow_finished", status="failed"), event("workflow_started"))
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed


def test_a_pause_that_cannot_be_written_fails_the_run(redis_store: RedisServer) -> None:
    with connect(redis_store.url) as backend:
        lost: list[str] = []
        c = coordinator(DurableEventTransport(backend), on_pause_lost=lost.append, end_deadline=0.5)
        c.publish(event("workflow_started"))
        redis_store.kill()
        c.publish(event("workflow_paused", paused_node_id="approve"))
        assert c.state is AppExecutionState.TERMINAL
        assert len(lost) == 1 and "unavailable when the run paused" in lost[0]


def test_a_failed_append_of_an_ordinary_event_raises_to_end_the_attempt(redis_store: RedisServer) -> None:
    with connect(redis_store.url) as backend:
        c = coordinator(DurableEventTransport(backend))
        c.publish(event("workflow_started"))
        redis_store.kill()
        with pytest.raises(DurableStreamUnavailableError):
            c.publish(event("text_chunk", text="lost"))
        assert c.state is AppExecutionState.RUNNING
