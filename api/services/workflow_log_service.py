"""Dify's ``GET /workflows/logs``: the app's runs, newest first, paged and filtered as Dify documents it.

A run is its own log entry here (Dify keeps a log row per run; its id is the run's).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, or_, select

from api.libs.errors import InvalidParamError
from api.models import App, WorkflowRun
from api.models.engine import db

from . import end_user_service
from .app_info_service import version
from .validation import MAX_USER_LENGTH

#: The statuses Dify filters by (``partial-succeeded`` is a Dify status no run here has).
STATUSES = ("succeeded", "failed", "stopped", "partial-succeeded", "running", "paused")
MAX_LIMIT = 100


def _integer(args: Mapping[str, str], name: str, default: int, low: int, high: int | None = None) -> int:
    raw = args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidParamError(f"'{name}' must be a whole number") from None
    if value < low or (high is not None and value > high):
        raise InvalidParamError(f"'{name}' must be between {low} and {high or 'any'}")
    return value


def _moment(args: Mapping[str, str], name: str) -> datetime.datetime | None:
    raw = args.get(name)
    if not raw:
        return None
    try:
        value = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidParamError(f"'{name}' must be an ISO 8601 time, e.g. 2024-01-01T00:00:00Z") from None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def _unix(value: datetime.datetime | None) -> int | None:
    if value is None:
        return None
    return int((value if value.tzinfo else value.replace(tzinfo=datetime.UTC)).timestamp())


def logs(app: App, args: Mapping[str, str]) -> dict[str, Any]:
    """``WorkflowLogsResponse`` of the app's runs matching ``args`` (``keyword``, ``status``, ``page``,
    ``limit``, ``created_at__before``, ``created_at__after``, ``created_by_end_user_session_id``,
    ``created_by_account``).

    Raises:
        InvalidParamError: (400 ``invalid_param``) a malformed or out-of-range parameter, or an account
            (this deployment has none: every run is an end user's).
    """
    page = _integer(args, "page", 1, 1, 99999)
    limit = _integer(args, "limit", 20, 1, MAX_LIMIT)
    status = args.get("status") or None
    if status is not None and status not in STATUSES:
        raise InvalidParamError(f"'status' must be one of {', '.join(STATUSES)}")
    account = args.get("created_by_account")
    if account:
        raise InvalidParamError(f"Account not found: {account}")
    conditions = [WorkflowRun.app_id == app.id]
    if status is not None:
        conditions.append(WorkflowRun.status == status)
    if (before := _moment(args, "created_at__before")) is not None:
        conditions.append(WorkflowRun.created_at <= before)
    if (after := _moment(args, "created_at__after")) is not None:
        conditions.append(WorkflowRun.created_at >= after)
    session = args.get("created_by_end_user_session_id")
    if session:
        conditions.append(WorkflowRun.end_user == session[:MAX_USER_LENGTH])
    keyword = args.get("keyword")
    if keyword:
        pattern = "%" + keyword[:255].replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        conditions.append(
            or_(
                WorkflowRun.inputs_json.like(pattern, escape="\\"),
                WorkflowRun.outputs_json.like(pattern, escape="\\"),
                WorkflowRun.end_user.like(pattern, escape="\\"),
            )
        )
    total = db.session.execute(select(func.count()).select_from(WorkflowRun).where(*conditions)).scalar_one()
    rows = (
        db.session.execute(
            select(WorkflowRun)
            .where(*conditions)
            .order_by(WorkflowRun.created_at.desc(), WorkflowRun.id)
            .offset((page - 1) * limit)
            .limit(limit)
        )
        .scalars()
        .all()
    )
    return {
        "page": page,
        "limit": limit,
        "total": total,
        "has_more": page * limit < total,
        "data": [_item(app, run) for run in rows],
    }


def _item(app: App, run: WorkflowRun) -> dict[str, Any]:
    created_at = _unix(run.created_at)
    return {
        "id": run.id,
        "workflow_run": {
            "id": run.id,
            "version": version(app),
            "status": run.status,
            "error": run.error,
            "elapsed_time": round(run.elapsed_time, 6),
            "total_tokens": run.total_tokens or 0,
            "total_steps": run.total_steps,
            "created_at": created_at,
            "finished_at": _unix(run.finished_at),
            "exceptions_count": 0,
            "triggered_from": "app-run",
        },
        "created_from": "service-api",
        "created_by_role": "end_user",
        "created_by_account": None,
        "created_by_end_user": end_user_service.summary(app.id, run.end_user),
        "created_at": created_at,
        "details": None,
    }
