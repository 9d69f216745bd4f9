"""A finished run whose end a stream-store failover lost: readers are never served a partial run that
looks whole or never ends.

The row records where the topic ended when the end was written (``stream_final_ordinal`` and
``_digest``). A reader of the run finds the store short of that, the end is written again: only the
seal lost, sealed again where it was (the run reads whole); events lost with the worker that had
them, a new incarnation with the end, so that a late reader gets 410 ``run_events_lost`` with the run
row and a reader with a cursor 410. The store forgets through the tests' hook into the library.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from api.core.app.apps.run_history import history_gap
from api.core.app.apps.topics import workflow_run_topic
from api.extensions.ext_durable_stream import durable_stream
from api.models import WorkflowRun
from api.models.engine import db
from harness.hostile_target import FAST_WORKFLOW as FAST
from harness.waiting import wait_until
from tests.app.conftest import AppHarness
from tests.app.test_events_sse import events_of, reconnect, run_streaming, stream
from tests.app.test_service_api import slow_greeting
from tests.durable_stream import hooks


@pytest.fixture(scope="module")
def fast_app(harness: AppHarness) -> dict[str, str]:
    return harness.create_app(FAST)


def recorded_end(run_id: str) -> WorkflowRun:
    """The run's row once its worker recorded the end of its stream (just after sealing it: a reader can
    be there first). In an app context."""

    def recorded() -> WorkflowRun | None:
        db.session.remove()
        found = db.session.get(WorkflowRun, run_id)
        return found if found is not None and found.stream_ended else None

    return wait_until(recorded, 10, "the worker to record the end of the run's stream")


def finished_run(harness: AppHarness, key: str) -> tuple[str, str, list[dict[str, object]], list[str]]:
    messages = [m for m in run_streaming(harness, key, {"n": "1"}) if not m.is_ping]
    run_id, task_id = messages[0].json["workflow_run_id"], messages[0].json["task_id"]
    with harness.app.app_context():
        row = recorded_end(run_id)
        info = durable_stream().admin.topic_info(workflow_run_topic("workflow", run_id))
        assert info is not None and info.sealed
        # The row knows where the run's stream ended, and that is the whole run.
        assert (row.stream_final_ordinal, row.stream_final_digest) == (info.last_ordinal, info.last_digest)
        assert history_gap(row, info) is None
    return run_id, task_id, [m.json for m in messages], [str(m.id) for m in messages]


def test_a_lost_seal_is_sealed_again_and_the_run_reads_whole(harness: AppHarness, fast_app: dict[str, str]) -> None:
    key = fast_app["api_key"]
    run_id, task_id, events, _ = finished_run(harness, key)
    name = workflow_run_topic("workflow", run_id)
    with harness.app.app_context():
        hooks.lose_last_records(durable_stream(), name, 0)  # every event is there, the seal is not
        info = durable_stream().admin.topic_info(name)
        assert info is not None and not info.sealed
    # A late reader gets the whole run, which ends (before: it waited for an end that never came).
    assert events_of(stream(reconnect(harness, key, task_id, "u1"))) == events
    with harness.app.app_context():
        info = durable_stream().admin.topic_info(name)
        assert info is not None and info.sealed and info.last_ordinal == len(events)


def test_lost_events_are_410_for_every_reader_never_a_partial_run(
    harness: AppHarness, fast_app: dict[str, str]
) -> None:
    key = fast_app["api_key"]
    run_id, task_id, _, ids = finished_run(harness, key)
    name = workflow_run_topic("workflow", run_id)
    with harness.app.app_context():
        hooks.lose_last_records(durable_stream(), name, 2)  # workflow_finished and the event before it
        gap = history_gap(db.session.get(WorkflowRun, run_id), durable_stream().admin.topic_info(name))  # type: ignore[arg-type]
        assert gap is not None and "not at the run's end" in gap
    late = reconnect(harness, key, task_id, "u1")
    assert late.status_code == 410, late.get_data(as_text=True)
    assert late.json["code"] == "run_events_lost" and late.json["run"]["status"] == "succeeded"
    resumed = reconnect(harness, key, task_id, "u1", last_event_id=ids[0])
    assert resumed.status_code == 410
    with harness.app.app_context():
        row = db.session.get(WorkflowRun, run_id)
        info = durable_stream().admin.topic_info(name)
        # The end was written again, in a new incarnation (so every reader can tell), and sealed.
        assert row is not None and info is not None and row.stream_ended and info.sealed
        assert info.epoch != row.stream_epoch and row.stream_final_ordinal == info.last_ordinal
    # Without a snapshot, a finished run's reader gets its end from the row, as always.
    assert [
        e["event"] for e in events_of(stream(reconnect(harness, key, task_id, "u1", include_state_snapshot="false")))
    ] == ["workflow_finished"]


def test_events_lost_with_their_worker_make_the_history_restart_not_a_partial_run(
    make_harness: Callable[..., AppHarness],
) -> None:
    # The worker records its last appended event with each lease renewal; it dies, and the store (a
    # failover) has lost that event: nobody can put it back, so the run's end goes to a new incarnation.
    harness = make_harness(WORKFLOW_LEASE_TTL=1.5)
    key = harness.create_app(slow_greeting(delay=0.05, tokens=2000))["api_key"]
    started = harness.post(
        "/v1/workflows/run", key, {"inputs": {"name": "Lee"}, "user": "u1", "response_mode": "async"}
    )
    assert started.status_code == 202, started.json
    run_id, task_id = started.json["workflow_run_id"], started.json["task_id"]
    name = workflow_run_topic("workflow", run_id)
    with harness.app.app_context():

        def progress() -> int | None:
            db.session.remove()
            row = db.session.get(WorkflowRun, run_id)
            return (
                None
                if row is None or not row.stream_progress_ordinal or row.stream_progress_ordinal < 5
                else row.stream_progress_ordinal
            )

        wait_until(progress, 20, "the worker to record its progress")
        assert harness.worker is not None
        harness.worker.kill()
        row = db.session.get(WorkflowRun, run_id)
        info = durable_stream().admin.topic_info(name)
        assert row is not None and row.stream_progress_ordinal is not None and info is not None
        # The store lost everything from the event the worker last recorded on.
        hooks.lose_last_records(durable_stream(), name, info.last_ordinal - row.stream_progress_ordinal + 1)
        old_epoch, expires = row.stream_epoch, row.lease_expires_at
    assert expires is not None
    # The next reader once the lease has expired fails the run and writes its end, in a new incarnation.
    time.sleep(max(0.0, expires - time.time()) + 0.05)
    late = reconnect(harness, key, task_id, "u1")
    assert late.status_code == 410, late.get_data(as_text=True)
    assert late.json["code"] == "run_events_lost" and late.json["run"]["status"] == "failed"
    with harness.app.app_context():
        db.session.remove()
        info = durable_stream().admin.topic_info(name)
        assert info is not None and info.epoch != old_epoch and info.sealed
