"""Handing execution attempts to Celery: the one place that sends their task messages.

Every attempt's message is in the task outbox (``api.core.app.apps.task_outbox``) from the transaction
that queued the attempt (a run's start, a form's answer or timeout) until a worker claims the attempt.
The accepting request sends it at once (:func:`send_now`); the dispatcher (:func:`dispatch_due`, every
reaper sweep in the API processes and the Celery workers, and :func:`redispatch` on every read of a run)
sends it when that request never did (its process died, the broker was away) and again when no worker
claimed the attempt within ``WORKFLOW_REDISPATCH_AFTER`` of a send (the broker lost it; a worker died
holding it), backing off each time. A duplicate is harmless: only one delivery can claim an attempt.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from flask import current_app

from api.configs import AppConfig
from api.core.app.apps import run_store, task_outbox
from api.core.app.apps.task_outbox import Message
from api.libs import log_context, metrics
from api.models import WorkflowRun

logger = logging.getLogger(__name__)

#: A message is sent again after WORKFLOW_REDISPATCH_AFTER, then twice, four, eight times that at most.
MAX_BACKOFF = 8


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def message_of(run: WorkflowRun, resume_form: Mapping[str, Any] | None = None) -> Message:
    assert run.attempt_id is not None
    return Message(run.id, run.task_id, run.attempt_id, None if resume_form is None else dict(resume_form))


def send(message: Message) -> None:
    """Hand one message to the broker and record that it did.

    Raises:
        Exception: Whatever the broker's client raises.
    """
    celery_app = current_app.extensions["celery"]
    config = _config()
    # Celery's own lines (received, succeeded) name the task by the run's task id, as the API does.
    celery_app.send_task(
        message.task,
        args=message.args,
        kwargs={"attempt_id": message.attempt_id},
        queue=config.CELERY_QUEUE,
        task_id=message.task_id,
    )
    backoff = config.WORKFLOW_REDISPATCH_AFTER * min(MAX_BACKOFF, 2**message.sends)
    task_outbox.sent(message.attempt_id, time.time() + backoff)
    try:
        run_store.mark_queued(message.run_id, message.attempt_id)
    except Exception:  # the outbox knows it was sent; the column only informs
        logger.warning("run %s: could not record that its task was queued", message.run_id, exc_info=True)


def send_now(run: WorkflowRun, resume_form: Mapping[str, Any] | None = None) -> bool:
    """Send the message of the run's current attempt, just recorded in the outbox by the request that
    queued it. A broker that cannot take it now is no error: the dispatcher sends it when it can."""
    try:
        send(message_of(run, resume_form))
    except Exception as exc:
        metrics.TASK_SENDS.tally.add(("first", "failed"))
        logger.warning("run %s: could not queue its task now (%s); it is sent when the broker answers", run.id, exc)
        return False
    metrics.TASK_SENDS.tally.add(("first", "ok"))
    return True


@dataclasses.dataclass
class DispatchReport:
    """What one dispatcher sweep did."""

    sent: int = 0
    failed: int = 0
    dropped: int = 0

    def __bool__(self) -> bool:
        return bool(self.sent or self.failed)

    def __str__(self) -> str:
        return f"{self.sent} task message(s) sent again, {self.failed} could not be sent"


def _dispatch(message: Message, now: float, report: DispatchReport) -> None:
    config = _config()
    # Nobody else sends it meanwhile; a send that fails is tried again once this hold is over.
    if not task_outbox.take_turn(message.attempt_id, now, config.WORKFLOW_DISPATCH_GRACE):
        return
    with log_context.bound({"task_id": message.task_id, "workflow_run_id": message.run_id}):
        try:
            send(message)
        except Exception as exc:
            report.failed += 1
            metrics.TASK_SENDS.tally.add(("again", "failed"))
            logger.warning("run %s: could not queue its task (%s); trying again later", message.run_id, exc)
            return
        report.sent += 1
        metrics.TASK_SENDS.tally.add(("again", "ok"))
        metrics.REAPS.tally.add(("requeued",))
        why = "no worker claimed its attempt" if message.sends else "its task message never reached the broker"
        logger.warning("run %s: %s; queued it again (send %d)", message.run_id, why, message.sends + 1)


def dispatch_due(limit: int = 100) -> DispatchReport:
    """One dispatcher sweep: send every message that is due (and drop those whose attempt is over)."""
    now = time.time()
    messages, dropped = task_outbox.due(now, limit)
    report = DispatchReport(dropped=dropped)
    for message in messages:
        _dispatch(message, now, report)
    return report


def redispatch(run: WorkflowRun) -> bool:
    """Send the message of ``run``'s current attempt if it is due (a read of the run checks it)."""
    if run.attempt_id is None or run.attempt_started_at is not None:
        return False
    found = task_outbox.pending(run.id, run.task_id, run.attempt_id)
    now = time.time()
    if found is None or found[1] > now:
        return False
    report = DispatchReport()
    _dispatch(found[0], now, report)
    return report.sent > 0
