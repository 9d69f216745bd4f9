"""Runs one execution attempt of a workflow run inside a Celery worker.

Task messages are acknowledged late and may be delivered more than once (a worker killed with
messages in hand, a Redis broker's visibility timeout). An attempt therefore runs only after the
worker *claims* it: a conditional row update that exactly one delivery of the current attempt wins.
Every other delivery raises :class:`AttemptNotClaimedError`, and the task decides what the row
says about the run (see ``api.services.run_recovery``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import current_app

from api.configs import AppConfig
from api.core.durable_stream import DurableStreamError
from api.core.workflow import ModelSettings, ResumePoint, WorkflowEngine
from api.core.workflow.commands import redis_channel
from api.libs import log_context
from api.libs.errors import STREAM_FAILED_RUN
from api.models import App, WorkflowRun
from api.models.engine import db

from . import form_store, run_store
from .event_transport import WorkflowEventTransport
from .execution_coordinator import AppExecutionCoordinator, RunIdentity, RunTakenOverError
from .lease import RunLease
from .topics import workflow_run_topic

logger = logging.getLogger(__name__)

#: What a run that failed on something other than its own nodes says (the detail is in the worker's log).
INTERNAL_ERROR = "the run failed on an internal error"
#: Seconds past its own retry deadline that a finisher keeps others from repairing the end it writes.
REPAIR_MARGIN = 5.0


class AttemptNotClaimedError(Exception):
    """This delivery may not run the attempt: it is stale, a duplicate, or its run is not running."""


def execute_run(
    transport: WorkflowEventTransport,
    workflow_run_id: str,
    attempt_id: str | None = None,
    resume_form: Mapping[str, Any] | None = None,
    redis: Any | None = None,
) -> str | None:
    """Claim and run (or resume) the attempt; return its final status, or ``None`` if it stopped early.

    ``transport`` carries the run's events (the task passes the app's configured one); ``redis``, the app's
    Redis client where it has one, carries stops to graphon (its command channel).

    Raises:
        AttemptNotClaimedError: Another delivery holds (or held) this attempt, or it is not current.
    """
    config: AppConfig = current_app.config["APP_CONFIG"]
    run = db.session.get(WorkflowRun, workflow_run_id)
    if run is None:
        logger.warning("run %s does not exist", workflow_run_id)
        return None
    # Messages queued before attempts had ids name none: they stand for the current attempt.
    attempt_id = attempt_id or run.attempt_id
    if attempt_id is None or not run_store.claim(workflow_run_id, attempt_id, config.WORKFLOW_LEASE_TTL):
        db.session.remove()
        raise AttemptNotClaimedError(f"attempt {attempt_id} of run {workflow_run_id} is not this delivery's to run")
    app = db.session.get(App, run.app_id)
    assert app is not None
    topic_name = workflow_run_topic(app.mode, run.id)
    identity = RunIdentity(app.id, run.task_id, run.id, run.created_timestamp, run.end_user)
    fields = log_context.fields_of(
        app_id=app.id, task_id=run.task_id, workflow_run_id=run.id, transport=config.WORKFLOW_EVENT_TRANSPORT
    )
    with log_context.bound(fields):
        return _attempt(config, transport, run, app, topic_name, identity, resume_form, redis)


def _in_app(flask_app: Any, work: Callable[[], None]) -> None:
    """``work`` in the app's context: graphon calls the human-input node's callback on a thread of its own."""
    with flask_app.app_context():
        work()


def _attempt(
    config: AppConfig,
    transport: WorkflowEventTransport,
    run: WorkflowRun,
    app: App,
    topic_name: str,
    identity: RunIdentity,
    resume_form: Mapping[str, Any] | None,
    redis: Any | None,
) -> str | None:
    """The claimed attempt of ``run`` (whose rows are still loaded), with its log fields bound."""
    workflow_run_id = run.id
    graph_definition, inputs, end_user, state_json = app.graph_json, run.inputs, run.end_user, run.state_json
    epoch_known = run.stream_epoch is not None
    db.session.remove()  # the attempt may take minutes; hold no connection meanwhile
    logger.info("run %s: attempt started%s", workflow_run_id, " (resumed)" if resume_form is not None else "")

    engine: WorkflowEngine | None = None
    steps = 0

    def persist(event: Mapping[str, Any]) -> bool:
        data = event["data"]
        if event["event"] == "workflow_paused":
            assert engine is not None and engine.outcome is not None and engine.outcome.state is not None
            outcome = engine.outcome
            assert outcome.state is not None
            return run_store.pause(workflow_run_id, outcome.state, outcome.steps, outcome.tokens)
        total = data.get("total_steps") or steps
        return run_store.finish(
            workflow_run_id,
            data["status"],
            outputs=data["outputs"],
            error=data["error"],
            steps=total,
            tokens=data.get("total_tokens"),
            repair_after=time.time() + config.WORKFLOW_END_RETRY_DEADLINE + REPAIR_MARGIN,
        )

    def pause_lost(error: str) -> None:
        run_store.finish(workflow_run_id, "failed", outputs=None, error=error, steps=steps, expected=run_store.PAUSED)

    def record_epoch() -> None:
        # Readers compare it with the topic they find: another incarnation is not this run's history.
        info = transport.topic_info(topic_name)
        if info is not None:
            run_store.record_stream_epoch(workflow_run_id, info.epoch)

    coordinator = AppExecutionCoordinator(
        transport=transport,
        topic_name=topic_name,
        run=identity,
        max_execution_time=config.APP_MAX_EXECUTION_TIME,
        stop_requested=lambda: run_store.stop_requested(workflow_run_id),
        on_abort=lambda reason: run_store.request_stop(workflow_run_id),
        before_end=persist,
        on_stream_ended=lambda info: run_store.mark_stream_ended(workflow_run_id, info),
        on_pause_lost=pause_lost,
        started_sent=resume_form is not None,
        stop_check_interval=config.WORKFLOW_STOP_CHECK_INTERVAL,
        end_deadline=config.WORKFLOW_END_RETRY_DEADLINE,
        repair_window=config.WORKFLOW_EVENT_REPAIR_WINDOW,
    )
    flask_app = current_app._get_current_object()  # type: ignore[attr-defined]
    with RunLease(flask_app, workflow_run_id, config.WORKFLOW_LEASE_TTL, lambda: coordinator.stream_progress):
        coordinator.start()
        error: str | None = None
        try:
            # Everything that can fail, building the engine included, happens under the coordinator,
            # so that no failure leaves the run's topic open.
            resume = None
            if resume_form is not None:
                if state_json is None:
                    raise RuntimeError("the run has no saved pause state to resume from")
                resume = ResumePoint(state=json.loads(state_json), submission=resume_form)
            engine = WorkflowEngine(
                json.loads(graph_definition),
                app_id=identity.app_id,
                task_id=identity.task_id,
                workflow_run_id=identity.workflow_run_id,
                inputs=inputs,
                user=end_user,
                created_at=identity.created_at,
                models=ModelSettings(
                    token_delay=config.WORKFLOW_LLM_TOKEN_DELAY,
                    base_url=config.WORKFLOW_MODEL_BASE_URL,
                    api_key=config.WORKFLOW_MODEL_API_KEY,
                ),
                should_stop=coordinator.should_stop,
                resume=resume,
                open_form=lambda node, form: _in_app(
                    flask_app, lambda: form_store.open_form(identity.app_id, workflow_run_id, form)
                ),
                form_timeout=config.HUMAN_INPUT_FORM_TIMEOUT,
                workers=config.WORKFLOW_GRAPH_WORKERS,
                command_channel=None if redis is None else redis_channel(redis, workflow_run_id),
            )
            for event in engine.run():
                if event["event"] == "node_started":
                    steps = coordinator.steps = int(event["data"]["index"])
                coordinator.tokens = engine.tokens
                coordinator.publish(event)
                if not epoch_known and event["event"] == "workflow_started":
                    epoch_known = True
                    try:
                        record_epoch()
                    except Exception:  # readers then rely on the first-event check alone
                        logger.exception("could not record the stream epoch of run %s", workflow_run_id)
        except RunTakenOverError:
            logger.warning("run %s was ended by someone else; abandoning this attempt", workflow_run_id)
            return None
        except DurableStreamError:
            # The detail goes to the log with the run's ids; the run's error is for its users.
            logger.exception("run %s: the event stream failed", workflow_run_id)
            error = STREAM_FAILED_RUN
        except Exception:
            logger.exception("run %s failed", workflow_run_id)
            error = INTERNAL_ERROR
        if coordinator.finish(error):
            return "failed"
    outcome = engine.outcome if engine is not None else None
    status = None if outcome is None else outcome.status
    logger.info("run %s: attempt ended (%s)", workflow_run_id, status)
    return status
