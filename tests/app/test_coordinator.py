"""AppExecutionCoordinator against a real (SQLite) durable stream: sealing rules and the failed end."""

from __future__ import annotations

import itertools
import json
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.app.apps.execution_coordinator import (
    AppExecutionCoordinator,
    AppExecutionState,
    RunIdentity,
    RunTakenOverError,
)
from api.core.durable_stream import CLOSED, DurableStreamBackend, DurableStreamTopic, TopicSealedError, connect
from api.core.workflow.events import make_event

RUN = RunIdentity(app_id="app", task_id="task", workflow_run_id="run", created_at=time.time())


@pytest.fixture
def backend(tmp_path: pathlib.Path) -> Iterator[DurableStreamBackend]:
    with connect(f"sqlite:///{tmp_path / 'streams.db'}") as backend:
        yield backend


@pytest.fixture
def topic(backend: DurableStreamBackend) -> DurableStreamTopic:
    return backend.topic("workflow:workflow_run:run")


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
            events.append(json.loads(record.payload))


def coordinator(topic: DurableStreamTopic, **kwargs: Any) -> AppExecutionCoordinator:
    kwargs.setdefault("max_execution_time", 60)
    kwargs.setdefault("stop_requested", lambda: False)
    return AppExecutionCoordinator(topic=topic, run=RUN, **kwargs)


def test_terminal_event_is_appended_then_the_topic_sealed(topic: DurableStreamTopic) -> None:
    ended: list[str] = []
    c = coordinator(topic, before_end=lambda e: ended.append(e["data"]["status"]))
    c.start()
    c.publish(event("workflow_started"))
    c.publish(event("workflow_finished", status="succeeded", outputs={}, error=None))
    assert c.finish() is False
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed
    assert ended == ["succeeded"] and c.state is AppExecutionState.TERMINAL
    with pytest.raises(TopicSealedError):
        topic.append(b"late")


def test_pause_is_appended_without_sealing(topic: DurableStreamTopic) -> None:
    c = coordinator(topic)
    c.publish(event("workflow_started"))
    c.publish(event("workflow_paused", paused_node_id="approve"))
    assert c.finish() is False and c.state is AppExecutionState.PAUSED
    events, sealed = read_all(topic)
    assert events[-1]["event"] == "workflow_paused" and not sealed
    resumed = coordinator(topic, started_sent=True)  # a resumed attempt continues on the same topic
    resumed.publish(event("workflow_finished", status="succeeded", outputs={}, error=None))
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_paused", "workflow_finished"] and sealed


def test_an_attempt_without_a_terminal_event_ends_failed_and_sealed(topic: DurableStreamTopic) -> None:
    c = coordinator(topic)
    c.publish(event("workflow_started"))
    c.publish(event("node_started", node_id="draft"))
    assert c.finish("internal error: boom") is True
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "node_started", "workflow_finished"] and sealed
    assert events[-1]["data"]["status"] == "failed" and events[-1]["data"]["error"] == "internal error: boom"


def test_a_failure_before_any_event_sends_a_synthetic_start_first(topic: DurableStreamTopic) -> None:
    c = coordinator(topic)
    assert c.finish("worker crashed") is True
    events, sealed = read_all(topic)
    assert [e["event"] for e in events] == ["workflow_started", "workflow_finished"] and sealed


def test_watchdog_requests_an_abort(topic: DurableStreamTopic) -> None:
    aborted: list[str] = []
    c = coordinator(topic, max_execution_time=0.2, on_abort=aborted.append, stop_check_interval=0)
    c.start()
    deadline = time.monotonic() + 5
    while c.should_stop() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "timed out" in (c.should_stop() or "") and c.state is AppExecutionState.ABORTING
    assert len(aborted) == 1


def test_stop_flag_is_checked_at_most_once_per_interval(topic: DurableStreamTopic) -> None:
    checks: list[float] = []

    def stop_requested() -> bool:
        checks.append(time.monotonic())
        return len(checks) >= 3

    c = coordinator(topic, stop_requested=stop_requested, stop_check_interval=0.05)
    deadline = time.monotonic() + 5
    while c.should_stop() is None:
        assert time.monotonic() < deadline
    assert c.should_stop() == "stopped by user"
    assert all(b - a >= 0.04 for a, b in itertools.pairwise(checks))


def test_a_topic_sealed_by_someone_else_takes_the_run_over(topic: DurableStreamTopic) -> None:
    c = coordinator(topic)
    c.publish(event("workflow_started"))
    topic.seal()  # e.g. the API's lease check ended the run
    with pytest.raises(RunTakenOverError):
        c.publish(event("node_started"))
    assert c.finish() is False
