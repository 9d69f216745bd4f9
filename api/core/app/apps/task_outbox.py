"""The task outbox's rows (``api.models.TaskOutbox``): written with the action, sent, re-sent, forgotten.

Like ``run_store``, every change is one conditional statement, so that the API processes and reapers
that dispatch at once never send one message in the same turn twice (a duplicate would be harmless
anyway: only one delivery of an attempt can claim it). :func:`add` and :func:`forget` take the caller's
connection, so that a message is recorded in the transaction that accepts its action and forgotten in
the one that claims its attempt.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, update

from api.models import TaskOutbox, WorkflowRun, WorkflowRunStatus
from api.models.engine import db

START_TASK = "workflow_based_app_execution_task"
RESUME_TASK = "resume_app_execution"


@dataclasses.dataclass(frozen=True)
class Message:
    """One attempt's task message as the broker gets it."""

    run_id: str
    #: The run's task id: Celery's lines name the message by it, as the API does.
    task_id: str
    attempt_id: str
    resume: dict[str, Any] | None
    sends: int = 0

    @property
    def task(self) -> str:
        return START_TASK if self.resume is None else RESUME_TASK

    @property
    def args(self) -> list[Any]:
        return [self.run_id] if self.resume is None else [self.run_id, self.resume]


def values(run_id: str, attempt_id: str, resume: Mapping[str, Any] | None, due_at: float) -> dict[str, Any]:
    """The row of a new attempt's message (for an ORM object or an insert)."""
    return {
        "attempt_id": attempt_id,
        "run_id": run_id,
        "task": START_TASK if resume is None else RESUME_TASK,
        "resume_json": None if resume is None else json.dumps(dict(resume)),
        "created_at": time.time(),
        "due_at": due_at,
        "sends": 0,
        "sent_at": None,
    }


def add(connection: Connection, run_id: str, attempt_id: str, resume: Mapping[str, Any] | None, due_at: float) -> None:
    """Record a new attempt's message in the caller's transaction."""
    connection.execute(insert(TaskOutbox).values(**values(run_id, attempt_id, resume, due_at)))


def forget(connection: Connection, run_id: str) -> None:
    """Drop every message of ``run_id`` in the caller's transaction (its attempt was claimed, or it ended)."""
    connection.execute(delete(TaskOutbox).where(TaskOutbox.run_id == run_id))


_COLUMNS = (TaskOutbox.run_id, TaskOutbox.attempt_id, TaskOutbox.resume_json, TaskOutbox.sends, TaskOutbox.due_at)


def _message(row: Any, task_id: str) -> Message:
    resume = None if row.resume_json is None else json.loads(row.resume_json)
    return Message(row.run_id, task_id, row.attempt_id, resume, int(row.sends))


def due(now: float, limit: int = 100) -> tuple[list[Message], int]:
    """Messages due to be sent (oldest first), and how many stale ones were dropped on the way: those
    whose attempt is no longer their run's current, unclaimed one (a stopped or failed run, a claim)."""
    current = (
        (WorkflowRun.status == WorkflowRunStatus.RUNNING.value)
        & (WorkflowRun.attempt_id == TaskOutbox.attempt_id)
        & WorkflowRun.attempt_started_at.is_(None)
    )
    query = (
        select(*_COLUMNS, current.label("current"), WorkflowRun.task_id)
        .join(WorkflowRun, WorkflowRun.id == TaskOutbox.run_id)
        .where(TaskOutbox.due_at <= now)
        .order_by(TaskOutbox.due_at)
        .limit(limit)
    )
    with db.engine.begin() as connection:
        rows = connection.execute(query).all()
        stale = [row.attempt_id for row in rows if not row.current]
        if stale:
            connection.execute(delete(TaskOutbox).where(TaskOutbox.attempt_id.in_(stale)))
    return [_message(row, row.task_id) for row in rows if row.current], len(stale)


def pending(run_id: str, task_id: str, attempt_id: str) -> tuple[Message, float] | None:
    """The message of ``run_id``'s attempt ``attempt_id`` and when it is due, if it was not claimed.

    Read through the caller's session (every read of a run asks this): a request that took a second
    connection of the pool for it waited for itself when the pool had one (503 ``database_busy``)."""
    row = db.session.execute(select(*_COLUMNS).where(TaskOutbox.attempt_id == attempt_id)).first()
    if row is None or row.run_id != run_id:
        return None
    return _message(row, task_id), float(row.due_at)


def take_turn(attempt_id: str, now: float, hold: float) -> bool:
    """Take the right to send a due message now; nobody else sends it for ``hold`` seconds."""
    statement = (
        update(TaskOutbox)
        .where(TaskOutbox.attempt_id == attempt_id, TaskOutbox.due_at <= now)
        .values(due_at=now + hold)
    )
    with db.engine.begin() as connection:
        return int(connection.execute(statement).rowcount) == 1


def sent(attempt_id: str, next_due: float) -> None:
    """A broker accepted the message: send it again at ``next_due`` unless a worker claims it first."""
    statement = (
        update(TaskOutbox)
        .where(TaskOutbox.attempt_id == attempt_id)
        .values(sends=TaskOutbox.sends + 1, sent_at=time.time(), due_at=next_due)
    )
    with db.engine.begin() as connection:
        connection.execute(statement)


def waiting_since(now: float) -> float | None:
    """When the longest-waiting message that a broker accepted and no worker claimed was first recorded
    (``None``: no such message)."""
    query = select(func.min(TaskOutbox.created_at)).where(TaskOutbox.sends > 0, TaskOutbox.created_at <= now)
    with db.engine.begin() as connection:
        value = connection.execute(query).scalar()
    return None if value is None else float(value)


def size() -> int:
    """Messages recorded and not yet claimed (sent or not)."""
    with db.engine.begin() as connection:
        return int(connection.execute(select(func.count()).select_from(TaskOutbox)).scalar() or 0)
