"""Celery tasks that execute workflow runs; every event goes to the run's durable-stream topic.

The workflow tasks are acknowledged late (see ``api.extensions.ext_celery``): a message is removed
from the broker only after its attempt ended, so a worker killed with messages in hand does not
lose them. A delivery that cannot claim its attempt (a duplicate, a stale message, or a run whose
attempt already died) runs nothing; it checks the run instead, which ends a run whose attempt died.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from sqlalchemy.exc import OperationalError

from api.core.app.apps.workflow_app_runner import AttemptNotClaimedError, execute_run
from api.extensions.ext_event_bus import event_transport
from api.extensions.ext_redis import app_redis
from api.services import human_input_service, idempotency, retention, run_recovery

logger = logging.getLogger(__name__)


def _execute(workflow_run_id: str, attempt_id: str | None, form: dict[str, Any] | None = None) -> str | None:
    try:
        return execute_run(event_transport(), workflow_run_id, attempt_id, resume_form=form, redis=app_redis())
    except AttemptNotClaimedError as exc:
        logger.info("%s; checking the run instead", exc)
        run_recovery.check_run_by_id(workflow_run_id)
        return None


#: The database being away when a delivery starts is retried (a new message, with backoff), rather
#: than acknowledged as done: the attempt has not been claimed yet.
RETRY_WHEN_DATABASE_IS_AWAY: dict[str, Any] = {
    "autoretry_for": (OperationalError,),
    "retry_backoff": 1,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": 20,
}


@shared_task(name="workflow_based_app_execution_task", ignore_result=True, **RETRY_WHEN_DATABASE_IS_AWAY)
def workflow_based_app_execution_task(workflow_run_id: str, attempt_id: str | None = None) -> str | None:
    return _execute(workflow_run_id, attempt_id)


@shared_task(name="resume_app_execution", ignore_result=True, **RETRY_WHEN_DATABASE_IS_AWAY)
def resume_app_execution(workflow_run_id: str, form: dict[str, Any], attempt_id: str | None = None) -> str | None:
    return _execute(workflow_run_id, attempt_id, form)


@shared_task(name="reap_expired_workflow_runs", ignore_result=True)
def reap_expired_workflow_runs() -> str:
    """One reaper sweep, for deployments that schedule it with Celery beat as well."""
    report = str(run_recovery.reap())
    human_input_service.expire_overdue()
    idempotency.purge_expired()
    return report


@shared_task(name="enforce_stream_retention", ignore_result=True)
def enforce_stream_retention() -> int:
    """One retention sweep of the stream store, scheduled by Celery beat (``BEAT_RETENTION_INTERVAL``)."""
    return retention.enforce_retention()
