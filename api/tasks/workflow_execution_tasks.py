"""Celery tasks that execute workflow runs; every event goes to the run's durable-stream topic."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from api.core.app.apps.workflow_app_runner import execute_run


@shared_task(name="workflow_based_app_execution_task", ignore_result=True)
def workflow_based_app_execution_task(workflow_run_id: str) -> str | None:
    return execute_run(workflow_run_id)


@shared_task(name="resume_app_execution", ignore_result=True)
def resume_app_execution(workflow_run_id: str, form: dict[str, Any]) -> str | None:
    return execute_run(workflow_run_id, resume_form=form)


@shared_task(name="reap_expired_workflow_runs", ignore_result=True)
def reap_expired_workflow_runs() -> int:
    from api.services.workflow_run_service import reap_expired_runs

    return reap_expired_runs()
