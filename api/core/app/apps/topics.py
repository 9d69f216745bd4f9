"""Where a run's events live: one durable-stream topic per workflow run."""

from __future__ import annotations


def workflow_run_topic(app_mode: str, workflow_run_id: str) -> str:
    return f"{app_mode}:workflow_run:{workflow_run_id}"
