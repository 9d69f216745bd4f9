"""Workflow events in the app's JSON shape: ``{"event", "task_id", "workflow_run_id", "data"}``."""

from __future__ import annotations

import time
from typing import Any


def make_event(event: str, *, task_id: str, workflow_run_id: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"event": event, "task_id": task_id, "workflow_run_id": workflow_run_id, "data": data}


def now() -> int:
    return int(time.time())
