"""Ending runs whose owner is gone: expired leases, attempts never started, and pending ends.

A run must always end, visibly: a terminal row *and* a ``workflow_finished`` record at the end of
its sealed topic. The worker's attempt normally writes both; when something died on the way, the
checks here finish the job. They run from several places — the reaper in every Celery worker and
every API process (:mod:`api.tasks.reaper`), Celery beat's reaper task, every read of a run
(its detail, its events, a blocking wait), the run watcher of every API process with open event
streams (:mod:`api.services.delivery.watcher`), and a task delivery that finds its attempt already
claimed — so a run's truth does not depend on who happens to be alive; and all of them are idempotent
and safe to run concurrently: each row change is a conditional update that one caller wins, and a
topic's end is written by :func:`~api.core.app.apps.run_end.write_end`, which is safe to repeat.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from flask import current_app
from sqlalchemy import and_, or_, select

from api.configs import AppConfig
from api.core.app.apps import run_store
from api.core.app.apps.run_end import write_end
from api.core.app.apps.run_history import holds_recorded_end
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CursorUnavailableError, DurableStreamError
from api.core.workflow.engine import finished_event
from api.core.workflow.events import make_event
from api.extensions.ext_durable_stream import durable_stream
from api.extensions.ext_event_bus import event_transport
from api.libs import log_context, metrics
from api.models import App, WorkflowRun, WorkflowRunStatus
from api.models.engine import db

from . import task_queue

logger = logging.getLogger(__name__)

LEASE_EXPIRED_ERROR = "the worker executing this run stopped responding (lease expired)"
#: How long a repair of a run's end may take before another party may try again (seconds).
REPAIR_HOLD = 30.0


@dataclasses.dataclass
class ReapReport:
    """What one sweep of the reaper did."""

    lease_expired: int = 0
    not_started: int = 0
    ends_written: int = 0
    requeued: int = 0

    def __str__(self) -> str:
        return (
            f"{self.lease_expired} run(s) with an expired lease and {self.not_started} never started "
            f"ended; {self.ends_written} pending end(s) written; {self.requeued} task message(s) sent again"
        )

    def __bool__(self) -> bool:
        return bool(self.lease_expired or self.not_started or self.ends_written or self.requeued)


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def started_event_of(app: App, run: WorkflowRun) -> dict[str, Any]:
    """A ``workflow_started`` for a run that ends before its worker sent one."""
    data = {
        "id": run.id,
        "workflow_id": app.id,
        "inputs": run.inputs,
        "created_at": int(run.created_timestamp),
        "reason": "initial",
    }
    return make_event("workflow_started", task_id=run.task_id, workflow_run_id=run.id, data=data)


def finished_event_of(run: WorkflowRun) -> dict[str, Any]:
    """The ``workflow_finished`` that the row of a terminal run describes."""
    return finished_event(
        task_id=run.task_id,
        workflow_run_id=run.id,
        app_id=run.app_id,
        status=run.status,
        outputs=run.outputs,
        error=run.error,
        steps=run.total_steps,
        tokens=run.total_tokens or 0,
        created_at=run.created_timestamp,
        finished_at=run.finished_timestamp,
        user=run.end_user,
    )


def check_run(app: App, run: WorkflowRun) -> bool:
    """Every check on one run: fail it if its worker or its start is overdue, and write a pending end.

    Returns whether anything changed. ``run`` is refreshed when its row changed.
    """
    with log_context.bound(run_log_fields(app, run)):
        failed = check_lease(app, run) or check_start_deadline(app, run)
        requeued = not failed and check_queued(run)
        return repair_end(app, run) or failed or requeued


def _progress_lost(run: WorkflowRun, name: str) -> bool:
    """Whether the store no longer holds the last event the run's worker recorded having appended (it has
    fewer records, or others in their place): the library's own check of a position's history.

    Raises:
        DurableStreamError: The store failed.
    """
    ordinal, epoch = run.stream_progress_ordinal, run.stream_epoch
    if ordinal is None or epoch is None or _config().WORKFLOW_EVENT_TRANSPORT != "durable_stream":
        return False
    backend = durable_stream()
    cursor = backend.admin.cursor_after(name, epoch, ordinal, run.stream_progress_digest or "")
    try:
        with backend.topic(name).subscribe_from_cursor(cursor):
            return False
    except CursorUnavailableError as exc:
        return exc.reason == "history_diverged"  # another incarnation or retention: not this check's to say


def repair_lost_end(app: App, run: WorkflowRun) -> bool:
    """:func:`check_lost_end`, then write the end again at once; for the readers of a finished run (one
    store round trip), not for every look at its row. ``run`` may be detached from the session (a reader
    holds no database connection while it talks to the store): the row is loaded again only when the
    end must be repaired. Never raises: a store that is away is the reader's own 503 (or the next check's).
    """
    if not _end_recorded(run):
        return False
    try:
        with log_context.bound(run_log_fields(app, run)):
            info = event_transport().topic_info(workflow_run_topic(app.mode, run.id))
            if info is None or holds_recorded_end(run, info):
                return False
            fresh = db.session.get(WorkflowRun, run.id, populate_existing=True)
            repaired = fresh is not None and check_lost_end(app, fresh) and repair_end(app, fresh)
            db.session.commit()
            return repaired
    except DurableStreamError as exc:
        logger.warning("run %s: could not check whether the stream store still holds its end: %s", run.id, exc)
        return False


def _end_recorded(run: WorkflowRun) -> bool:
    return (
        run.run_status.is_terminal
        and run.stream_ended
        and run.stream_final_ordinal is not None
        and _config().WORKFLOW_EVENT_TRANSPORT == "durable_stream"
    )


def check_lost_end(app: App, run: WorkflowRun) -> bool:
    """A run whose end was written, and whose topic no longer ends there (a stream-store failover lost
    its last events, its end or its seal): make its end pending again, so that :func:`repair_end` writes it.

    Only the seal lost, the end is sealed again where it was. Records lost, no one can put them back
    (the worker that had them is done): the topic is deleted, so that the end goes to a new incarnation
    and every reader is told (another epoch than the row's: 410) instead of reading a run with a hole.
    Rows written before the final position was recorded are not checked.
    """
    final_ordinal = run.stream_final_ordinal
    if not _end_recorded(run) or final_ordinal is None:
        return False
    name = workflow_run_topic(app.mode, run.id)
    transport = event_transport()
    info = transport.topic_info(name)
    # Sealed at the recorded end: whole (or, after an earlier gap, the new incarnation's end, which the
    # row records then; readers tell the incarnations apart by the row's epoch). No topic at all is
    # retention's doing as often as a loss: readers tell which from the row (``streams._events_lost``).
    if info is None or holds_recorded_end(run, info):
        return False
    if not run_store.reopen_end(run.id, final_ordinal):
        return False  # another process saw it first
    metrics.REAPS.tally.add(("end_lost",))
    whole_but_open = (
        info.epoch == run.stream_epoch
        and info.last_ordinal == final_ordinal
        and (not run.stream_final_digest or info.last_digest == run.stream_final_digest)
    )
    if whole_but_open:
        logger.warning("run %s: the stream store lost its seal; sealing it again", run.id)
    else:
        logger.warning(
            "run %s: the stream store lost its last events (it ends at %s, the run ended at %s); its history "
            "restarts in a new incarnation",
            run.id,
            info.last_ordinal,
            final_ordinal,
        )
        durable_stream().admin.delete_topic(name)
    db.session.refresh(run)
    return True


def run_log_fields(app: App, run: WorkflowRun) -> dict[str, str]:
    """What every log line about ``run`` carries (see ``api.libs.log_context``)."""
    return log_context.fields_of(
        app_id=app.id, task_id=run.task_id, workflow_run_id=run.id, transport=_config().WORKFLOW_EVENT_TRANSPORT
    )


def check_run_by_id(run_id: str) -> bool:
    run = db.session.get(WorkflowRun, run_id)
    if run is None:
        return False
    try:
        return check_run(_app_of(run), run)
    finally:
        db.session.commit()


def _app_of(run: WorkflowRun) -> App:
    app = db.session.get(App, run.app_id)
    assert app is not None
    return app


def check_lease(app: App, run: WorkflowRun) -> bool:
    """Fail a running run whose worker stopped renewing its lease, and write its end."""
    if run.status != WorkflowRunStatus.RUNNING.value or run.lease_expires_at is None:
        return False
    if run.lease_expires_at >= time.time():
        return False
    if not run_store.fail_if_lease_expired(run.id, LEASE_EXPIRED_ERROR):
        return False
    metrics.REAPS.tally.add(("lease_expired",))
    logger.warning("run %s: its worker's lease expired; the run failed", run.id)
    db.session.refresh(run)
    repair_end(app, run)
    return True


def check_start_deadline(app: App, run: WorkflowRun) -> bool:
    """Fail a run whose queued attempt no worker claimed in time (a lost or undeliverable task)."""
    timeout = _config().WORKFLOW_START_TIMEOUT
    if timeout <= 0 or run.status != WorkflowRunStatus.RUNNING.value or run.attempt_started_at is not None:
        return False
    if run.dispatched_at is None or run.dispatched_at >= time.time() - timeout:
        return False
    error = f"no worker started the run within {timeout:g} s of queueing it"
    if not run_store.fail_if_not_started(run.id, error, time.time() - timeout):
        return False
    metrics.REAPS.tally.add(("not_started",))
    logger.warning("run %s: %s; the run failed", run.id, error)
    db.session.refresh(run)
    repair_end(app, run)
    return True


def check_queued(run: WorkflowRun) -> bool:
    """Send again the task message of a run's current attempt that no worker claimed in time, or that
    never reached the broker (see :mod:`api.services.task_queue`). A duplicate is harmless: one claim wins."""
    if run.status != WorkflowRunStatus.RUNNING.value or run.attempt_started_at is not None:
        return False
    if not task_queue.redispatch(run):
        return False
    db.session.refresh(run)
    return True


def repair_end(app: App, run: WorkflowRun) -> bool:
    """Write the end of a terminal run whose topic lacks it. One try; a failure leaves it pending."""
    if not run.run_status.is_terminal or run.stream_ended:
        return False
    if not run_store.claim_end_repair(run.id, REPAIR_HOLD):
        return False  # its finisher still retries it, or another party repairs it right now
    # A run that recorded its topic's epoch had its workflow_started stored. If the topic is gone
    # now (a store that restarted empty), a synthetic start would make the end look like the whole
    # run to a reader; without it, the history visibly does not begin with the start (a 410).
    started = started_event_of(app, run) if run.stream_epoch is None else None
    name = workflow_run_topic(app.mode, run.id)
    try:
        transport = event_transport()  # a process's first use of the store connects, and may fail
        if _progress_lost(run, name):
            # Events the worker appended are gone (a failover), and the worker cannot append them again:
            # the end goes to a new incarnation, so that no reader takes the rest for the whole run.
            logger.warning("run %s: the stream store lost events its worker appended; its history restarts", run.id)
            metrics.REAPS.tally.add(("end_lost",))
            durable_stream().admin.delete_topic(name)
        write_end(transport, name, finished_event_of(run), started)
        final = transport.topic_info(name)
    except DurableStreamError as exc:
        logger.warning("run %s: its end is still pending: %s", run.id, exc)
        run_store.release_end_repair(run.id)
        return False
    run_store.mark_stream_ended(run.id, final)
    db.session.refresh(run)
    logger.info("run %s: its pending end was written", run.id)
    return True


def reap() -> ReapReport:
    """One sweep over every run that needs a check (see :func:`check_run`), then over the task outbox:
    every message never sent or not claimed in time is sent again (:func:`task_queue.dispatch_due`)."""
    now = time.time()
    timeout = _config().WORKFLOW_START_TIMEOUT
    running = WorkflowRun.status == WorkflowRunStatus.RUNNING.value
    overdue = [
        and_(running, WorkflowRun.lease_expires_at < now),
        and_(
            WorkflowRun.status.in_(run_store.TERMINAL),
            WorkflowRun.stream_ended.is_(False),
            or_(WorkflowRun.stream_repair_after.is_(None), WorkflowRun.stream_repair_after <= now),
        ),
    ]
    if timeout > 0:
        overdue.append(
            and_(running, WorkflowRun.attempt_started_at.is_(None), WorkflowRun.dispatched_at < now - timeout)
        )
    rows = db.session.execute(
        select(WorkflowRun, App).join(App, App.id == WorkflowRun.app_id).where(or_(*overdue))
    ).all()
    report = ReapReport()
    for run, app in rows:
        try:
            with log_context.bound(run_log_fields(app, run)):
                if check_lease(app, run):
                    report.lease_expired += 1
                elif check_start_deadline(app, run):
                    report.not_started += 1
                elif repair_end(app, run):
                    report.ends_written += 1
        except Exception:  # one run's trouble must not stop the sweep
            logger.exception("reaper: could not check run %s", run.id)
            db.session.rollback()
    db.session.commit()  # end the read transaction: the next sweep must see fresh rows
    report.requeued = task_queue.dispatch_due().sent
    return report
