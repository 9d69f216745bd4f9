"""Runs one execution attempt of a workflow run inside a Celery worker."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from flask import current_app

from api.configs import AppConfig
from api.core.workflow import Graph, WorkflowEngine
from api.core.workflow.engine import ResumePoint
from api.extensions.ext_database import db
from api.extensions.ext_event_bus import event_transport
from api.models import App, WorkflowRun, WorkflowRunStatus

from . import run_store
from .execution_coordinator import AppExecutionCoordinator, RunIdentity, RunTakenOverError
from .lease import RunLease
from .topics import workflow_run_topic

logger = logging.getLogger(__name__)


def execute_run(workflow_run_id: str, resume_form: Mapping[str, Any] | None = None) -> str | None:
    """Run (or resume) the workflow; return the attempt's final status, or ``None`` if it did not run."""
    config: AppConfig = current_app.config["APP_CONFIG"]
    run = db.session.get(WorkflowRun, workflow_run_id)
    if run is None:
        logger.warning("run %s does not exist", workflow_run_id)
        return None
    if run.status != WorkflowRunStatus.RUNNING.value:
        logger.info("run %s is %s; nothing to execute", workflow_run_id, run.status)
        return None
    app = db.session.get(App, run.app_id)
    assert app is not None
    topic = event_transport().topic(workflow_run_topic(app.mode, run.id))
    identity = RunIdentity(app.id, run.task_id, run.id, run.created_timestamp)
    graph_definition, inputs, end_user, state_json = app.graph_json, run.inputs, run.end_user, run.state_json
    db.session.remove()  # the attempt may take minutes; hold no connection meanwhile

    engine: WorkflowEngine | None = None
    steps = 0

    def persist(event: Mapping[str, Any]) -> None:
        data = event["data"]
        if event["event"] == "workflow_paused":
            assert engine is not None and engine.outcome is not None and engine.outcome.state is not None
            run_store.pause(workflow_run_id, engine.outcome.state, engine.outcome.steps)
        else:
            total = data.get("total_steps") or steps
            run_store.finish(workflow_run_id, data["status"], outputs=data["outputs"], error=data["error"], steps=total)

    coordinator = AppExecutionCoordinator(
        topic=topic,
        run=identity,
        max_execution_time=config.APP_MAX_EXECUTION_TIME,
        stop_requested=lambda: run_store.stop_requested(workflow_run_id),
        on_abort=lambda reason: run_store.request_stop(workflow_run_id),
        before_end=persist,
        started_sent=resume_form is not None,
        stop_check_interval=config.WORKFLOW_STOP_CHECK_INTERVAL,
    )
    flask_app = current_app._get_current_object()  # type: ignore[attr-defined]
    with RunLease(flask_app, workflow_run_id, config.WORKFLOW_LEASE_TTL):
        coordinator.start()
        error: str | None = None
        try:
            # Everything that can fail, building the engine included, happens under the coordinator,
            # so that no failure leaves the run's topic open.
            resume = None
            if resume_form is not None:
                if state_json is None:
                    raise RuntimeError("the run has no saved pause state to resume from")
                resume = ResumePoint(state=json.loads(state_json), form=resume_form)
            engine = WorkflowEngine(
                Graph(json.loads(graph_definition)),
                app_id=identity.app_id,
                task_id=identity.task_id,
                workflow_run_id=identity.workflow_run_id,
                inputs=inputs,
                user=end_user,
                created_at=identity.created_at,
                token_delay=config.WORKFLOW_LLM_TOKEN_DELAY,
                should_stop=coordinator.should_stop,
                resume=resume,
            )
            for event in engine.run():
                if event["event"] == "node_started":
                    steps = coordinator.steps = int(event["data"]["index"])
                coordinator.publish(event)
        except RunTakenOverError:
            logger.warning("run %s was ended by someone else; abandoning this attempt", workflow_run_id)
            return None
        except Exception as exc:
            logger.exception("run %s failed", workflow_run_id)
            error = f"internal error: {exc}"
        if coordinator.finish(error):
            return "failed"
    outcome = engine.outcome if engine is not None else None
    return None if outcome is None else outcome.status
