"""Workflow events in the app's JSON shape: ``{"event", "task_id", "workflow_run_id", "data"}``."""

from __future__ import annotations

import time
import uuid
from typing import Any

#: The namespace of end-user ids: one id per app and end user (the ``user`` of every request).
_END_USERS = uuid.UUID("6f1c2a3e-5b7d-4c1e-9a8f-0d2e4b6c8a10")


def make_event(event: str, *, task_id: str, workflow_run_id: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"event": event, "task_id": task_id, "workflow_run_id": workflow_run_id, "data": data}


def now() -> int:
    return int(time.time())


def end_user_id(app_id: str, user: str) -> str:
    """The id of ``user`` as an end user of the app (Dify's ``EndUser.id``): the same for every run."""
    return str(uuid.uuid5(_END_USERS, f"{app_id}\n{user}"))


def created_by(app_id: str, user: str) -> dict[str, str]:
    """Who started a run, as Dify names an end user in ``workflow_finished``: its id and its ``user``."""
    return {"id": end_user_id(app_id, user), "user": user}
