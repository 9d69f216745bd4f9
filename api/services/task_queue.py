"""Handing a run's current attempt to Celery: the one place that writes its task message."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import current_app

from api.configs import AppConfig
from api.core.app.apps import run_store
from api.models import WorkflowRun

logger = logging.getLogger(__name__)


def send_task(run: WorkflowRun, resume_form: Mapping[str, Any] | None = None) -> None:
    """Send the current attempt's task message (a resumed attempt's carries what resumes it), and record
    that it reached the broker.

    Raises:
        Exception: Whatever the broker's client raises.
    """
    celery_app = current_app.extensions["celery"]
    config: AppConfig = current_app.config["APP_CONFIG"]
    attempt = {"attempt_id": run.attempt_id}
    name, args = (
        ("workflow_based_app_execution_task", [run.id])
        if resume_form is None
        else ("resume_app_execution", [run.id, dict(resume_form)])
    )
    # Celery's own lines (received, succeeded) name the task by the run's task id, as the API does.
    celery_app.send_task(name, args=args, kwargs=attempt, queue=config.CELERY_QUEUE, task_id=run.task_id)
    if run.attempt_id is not None:
        try:
            run_store.mark_queued(run.id, run.attempt_id)
        except Exception:  # the message is out: queueing it again later would be a harmless duplicate
            logger.warning("run %s: could not record that its task was queued", run.id, exc_info=True)
