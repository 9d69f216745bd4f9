"""Run-row state transitions, each one conditional so that concurrent actors cannot both win.

Workers, API processes and the reaper all change ``workflow_runs`` rows; every transition is a
single ``UPDATE … WHERE <expected state>`` whose row count says who won. These functions use their
own short transactions on the engine, so they are safe from any thread (lease renewal, watchdog,
reaper) without touching the caller's session.

The columns that keep a run alive, whatever dies:

- ``attempt_id`` / ``dispatched_at`` / ``queued_at`` / ``attempt_started_at``: the attempt queued
  last, when its run committed it, whether its message reached the broker, and whether a worker
  claimed it. Only the first delivery of the current attempt runs; a run whose
  attempt was not claimed within the start deadline fails. The attempt's message waits in the task
  outbox (``task_outbox``) from the transaction that queues the attempt to the one that claims it.
- ``lease_expires_at``: renewed by the worker while its attempt runs; an expired lease fails the run.
- ``stream_ended`` / ``stream_repair_after``: whether the topic carries the run's end; a terminal
  run without it is "end pending" and is repaired (not before ``stream_repair_after``).
"""

from __future__ import annotations

import datetime
import json
import time
import uuid
from typing import Any

from sqlalchemy import ColumnElement, Update, or_, select, update

from api.core.durable_stream import TopicInfo
from api.libs import metrics
from api.models import WorkflowRun, WorkflowRunStatus
from api.models.engine import db

from . import form_store, task_outbox

RUNNING = WorkflowRunStatus.RUNNING.value
PAUSED = WorkflowRunStatus.PAUSED.value
FAILED = WorkflowRunStatus.FAILED.value
TERMINAL = tuple(status.value for status in WorkflowRunStatus if status.is_terminal)


def _execute(statement: Update) -> int:
    with db.engine.begin() as connection:
        return int(connection.execute(statement).rowcount)


def new_attempt_id() -> str:
    return uuid.uuid4().hex


def request_stop(run_id: str) -> None:
    _execute(update(WorkflowRun).where(WorkflowRun.id == run_id).values(stop_requested=True))


def stop(run_id: str, error: str, steps: int) -> str | None:
    """A user's stop, in one transaction: the stop flag, and the end of a run no worker is executing
    (paused: its open forms close; queued and not yet claimed: its message is forgotten). Returns the
    status the stop ended the run from, or ``None`` when a worker's attempt ends it at its next check
    (or the run had ended). A process that dies after it leaves nothing half done.
    """
    with db.engine.begin() as connection:
        connection.execute(update(WorkflowRun).where(WorkflowRun.id == run_id).values(stop_requested=True))
        for expected, *conditions in ((PAUSED,), (RUNNING, WorkflowRun.attempt_started_at.is_(None))):
            statement = (
                update(WorkflowRun)
                .where(WorkflowRun.id == run_id, WorkflowRun.status == expected, *conditions)
                .values(outputs_json=None, total_steps=steps, **_ended("stopped", error, None))
            )
            if int(connection.execute(statement).rowcount) == 1:
                connection.execute(form_store.close_run_forms_statement(run_id))
                task_outbox.forget(connection, run_id)
                _ended_run(True, "stopped")
                return expected
    return None


def stop_requested(run_id: str) -> bool:
    with db.engine.connect() as connection:
        return bool(connection.execute(select(WorkflowRun.stop_requested).where(WorkflowRun.id == run_id)).scalar())


def claim(run_id: str, attempt_id: str, ttl: float) -> bool:
    """Start the queued attempt ``attempt_id`` and take its lease; only one delivery of it wins."""
    now = time.time()
    statement = (
        update(WorkflowRun)
        .where(
            WorkflowRun.id == run_id,
            WorkflowRun.status == RUNNING,
            WorkflowRun.attempt_id == attempt_id,
            WorkflowRun.attempt_started_at.is_(None),
        )
        .values(attempt_started_at=now, lease_expires_at=now + ttl)
    )
    with db.engine.begin() as connection:
        if int(connection.execute(statement).rowcount) != 1:
            return False
        task_outbox.forget(connection, run_id)  # the claim is the worker's acknowledgement of the message
        return True


def record_stream_epoch(run_id: str, epoch: str) -> None:
    """Remember the incarnation of the run's topic its first event went to (once)."""
    _execute(
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.stream_epoch.is_(None))
        .values(stream_epoch=epoch)
    )


def renew_lease(run_id: str, ttl: float, progress: tuple[int, str] | None = None) -> bool:
    """Extend the lease; ``progress``: the (ordinal, digest) of the last event the worker appended."""
    values: dict[str, Any] = {"lease_expires_at": time.time() + ttl}
    if progress is not None:
        values.update(stream_progress_ordinal=progress[0], stream_progress_digest=progress[1] or None)
    statement = update(WorkflowRun).where(WorkflowRun.id == run_id, WorkflowRun.status == RUNNING).values(**values)
    return _execute(statement) == 1


def _ended(status: str, error: str | None, repair_after: float | None) -> dict[str, Any]:
    return {
        "status": status,
        "error": error,
        "state_json": None,
        "lease_expires_at": None,
        "finished_at": datetime.datetime.now(datetime.UTC),
        "stream_ended": False,
        "stream_repair_after": repair_after,
    }


def finish(
    run_id: str,
    status: str,
    *,
    outputs: Any,
    error: str | None,
    steps: int,
    tokens: int | None = None,
    expected: str = RUNNING,
    repair_after: float | None = None,
) -> bool:
    """Record the run's outcome; its topic's end is pending until :func:`mark_stream_ended`.

    ``repair_after`` keeps other parties from repairing the end while its writer still retries it;
    ``tokens`` (when known) replaces the run's token count.
    """
    counted = {} if tokens is None else {"total_tokens": tokens}
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == expected)
        .values(
            outputs_json=None if outputs is None else json.dumps(outputs),
            total_steps=steps,
            **counted,
            **_ended(status, error, repair_after),
        )
    )
    return _ended_run(_execute(statement) == 1, status)


def pause(run_id: str, state: dict[str, Any], steps: int, tokens: int = 0) -> bool:
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == RUNNING)
        .values(
            status=PAUSED, state_json=json.dumps(state), total_steps=steps, total_tokens=tokens, lease_expires_at=None
        )
    )
    return _execute(statement) == 1


def resume(
    run_id: str, submission: dict[str, Any] | None, *, send_after: float, answer: Update | None = None
) -> str | None:
    """Move a paused run back to running with a new queued attempt that ``submission`` resumes, and record
    the attempt's task message (due ``send_after`` seconds from now unless sent before), all in one
    transaction; with ``answer`` (a form's conditional answer or expiry), only if that wins too. Returns
    the attempt's id, or ``None`` when nothing changed.
    """
    attempt_id = new_attempt_id()
    now = time.time()
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == PAUSED)
        .values(
            status=RUNNING,
            stop_requested=False,
            lease_expires_at=None,
            resume_json=None if submission is None else json.dumps(submission),
            attempt_id=attempt_id,
            dispatched_at=now,
            queued_at=None,
            attempt_started_at=None,
        )
    )
    try:
        with db.engine.begin() as connection:
            if answer is not None and int(connection.execute(answer).rowcount) != 1:
                raise _Lost
            if int(connection.execute(statement).rowcount) != 1:
                raise _Lost  # rolled back: an answer is not taken for a run that does not resume
            task_outbox.add(connection, run_id, attempt_id, submission, now + send_after)
    except _Lost:
        return None
    return attempt_id


class _Lost(Exception):
    """A conditional update of a transaction lost its race: the whole transaction rolls back."""


def mark_queued(run_id: str, attempt_id: str) -> None:
    """Record that the attempt's task message reached the broker."""
    _execute(
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.attempt_id == attempt_id)
        .values(queued_at=time.time())
    )


def fail_if_lease_expired(run_id: str, error: str) -> bool:
    """Fail a running run whose worker stopped renewing its lease."""
    expired = WorkflowRun.lease_expires_at.is_not(None), WorkflowRun.lease_expires_at < time.time()
    return _fail_running(run_id, error, *expired)


def fail_if_not_started(run_id: str, error: str, dispatched_before: float) -> bool:
    """Fail a run whose current attempt was queued before ``dispatched_before`` and never claimed."""
    unclaimed = WorkflowRun.attempt_started_at.is_(None), WorkflowRun.dispatched_at < dispatched_before
    return _fail_running(run_id, error, *unclaimed)


def _fail_running(run_id: str, error: str, *conditions: ColumnElement[bool]) -> bool:
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == RUNNING, *conditions)
        .values(**_ended(FAILED, error, None))
    )
    return _ended_run(_execute(statement) == 1, FAILED)


def _ended_run(won: bool, status: str) -> bool:
    """Count a run that this update ended (exactly one update ends each run)."""
    if won:
        metrics.RUNS_FINISHED.tally.add((status,))
    return won


def claim_end_repair(run_id: str, hold: float) -> bool:
    """Take the right to write a terminal run's pending end for ``hold`` seconds."""
    now = time.time()
    statement = (
        update(WorkflowRun)
        .where(
            WorkflowRun.id == run_id,
            WorkflowRun.status.in_(TERMINAL),
            WorkflowRun.stream_ended.is_(False),
            or_(WorkflowRun.stream_repair_after.is_(None), WorkflowRun.stream_repair_after <= now),
        )
        .values(stream_repair_after=now + hold)
    )
    return _execute(statement) == 1


def mark_stream_ended(run_id: str, final: TopicInfo | None = None) -> None:
    """The topic ends with the run's end and is sealed; ``final`` is what the store said of it then."""
    values: dict[str, Any] = {"stream_ended": True, "stream_repair_after": None}
    if final is not None and final.sealed:
        values.update(stream_final_ordinal=final.last_ordinal, stream_final_digest=final.last_digest or None)
    _execute(update(WorkflowRun).where(WorkflowRun.id == run_id).values(**values))


def reopen_end(run_id: str, final_ordinal: int) -> bool:
    """The store lost the end recorded at ``final_ordinal`` (a failover): make the end pending again, once."""
    statement = (
        update(WorkflowRun)
        .where(
            WorkflowRun.id == run_id,
            WorkflowRun.stream_ended.is_(True),
            WorkflowRun.stream_final_ordinal == final_ordinal,
        )
        .values(stream_ended=False, stream_repair_after=None, stream_final_ordinal=None, stream_final_digest=None)
    )
    return _execute(statement) == 1


def release_end_repair(run_id: str) -> None:
    """Let the next check try again at once after a repair that failed."""
    _execute(
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.stream_ended.is_(False))
        .values(stream_repair_after=None)
    )
