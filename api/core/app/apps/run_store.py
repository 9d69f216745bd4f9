"""Run-row state transitions, each one conditional so that concurrent actors cannot both win.

Workers, API processes and the lease check all change ``workflow_runs`` rows; every transition is a
single ``UPDATE … WHERE status = <expected>`` whose row count says who won. These functions use
their own short transactions on the engine, so they are safe from any thread (lease renewal,
watchdog) without touching the caller's session.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

from sqlalchemy import select, update

from api.extensions.ext_database import db
from api.models import WorkflowRun, WorkflowRunStatus

RUNNING = WorkflowRunStatus.RUNNING.value
PAUSED = WorkflowRunStatus.PAUSED.value


def _execute(statement: Any) -> int:
    with db.engine.begin() as connection:
        return int(connection.execute(statement).rowcount)


def request_stop(run_id: str) -> None:
    _execute(update(WorkflowRun).where(WorkflowRun.id == run_id).values(stop_requested=True))


def stop_requested(run_id: str) -> bool:
    with db.engine.connect() as connection:
        return bool(connection.execute(select(WorkflowRun.stop_requested).where(WorkflowRun.id == run_id)).scalar())


def renew_lease(run_id: str, ttl: float) -> bool:
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == RUNNING)
        .values(lease_expires_at=time.time() + ttl)
    )
    return _execute(statement) == 1


def finish(run_id: str, status: str, *, outputs: Any, error: str | None, steps: int, expected: str = RUNNING) -> bool:
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == expected)
        .values(
            status=status,
            outputs_json=None if outputs is None else json.dumps(outputs),
            error=error,
            total_steps=steps,
            state_json=None,
            lease_expires_at=None,
            finished_at=datetime.datetime.now(datetime.UTC),
        )
    )
    return _execute(statement) == 1


def pause(run_id: str, state: dict[str, Any], steps: int) -> bool:
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == RUNNING)
        .values(status=PAUSED, state_json=json.dumps(state), total_steps=steps, lease_expires_at=None)
    )
    return _execute(statement) == 1


def resume(run_id: str) -> bool:
    statement = (
        update(WorkflowRun)
        .where(WorkflowRun.id == run_id, WorkflowRun.status == PAUSED)
        .values(status=RUNNING, stop_requested=False, lease_expires_at=None)
    )
    return _execute(statement) == 1


def fail_if_lease_expired(run_id: str, error: str) -> bool:
    now = time.time()
    statement = (
        update(WorkflowRun)
        .where(
            WorkflowRun.id == run_id,
            WorkflowRun.status == RUNNING,
            WorkflowRun.lease_expires_at.is_not(None),
            WorkflowRun.lease_expires_at < now,
        )
        .values(
            status=WorkflowRunStatus.FAILED.value,
            error=error,
            lease_expires_at=None,
            finished_at=datetime.datetime.now(datetime.UTC),
        )
    )
    return _execute(statement) == 1
