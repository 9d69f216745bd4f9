"""Running, inspecting, stopping and resuming workflow runs (the service API's behaviour)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from flask import current_app
from redis.exceptions import RedisError
from sqlalchemy import or_, select

from api.configs import AppConfig
from api.core.app.apps import run_store, task_outbox
from api.core.app.apps.event_codec import event_name
from api.core.app.apps.message_generator import MessageGenerator, StartAt
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, DurableStreamError
from api.core.workflow import Graph
from api.core.workflow.commands import send_abort
from api.core.workflow.events import created_by
from api.core.workflow.forms import pause_reason
from api.extensions.ext_event_bus import event_transport
from api.extensions.ext_redis import app_redis
from api.libs.errors import (
    STREAM_FAILED_RUN,
    STREAM_UNAVAILABLE,
    InvalidParamError,
    NotFoundError,
    RunWaitTimeoutError,
    ServiceUnavailableError,
)
from api.models import App, TaskOutbox, WorkflowRun, WorkflowRunStatus
from api.models.engine import db

from . import end_user_service, file_service, limits, run_recovery, task_queue
from .app_info_service import WORKFLOW_FILE_UPLOAD_LIMIT
from .validation import could_be_our_id, require_user

logger = logging.getLogger(__name__)

RESPONSE_MODES = ("blocking", "async", "streaming")


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def topic_name(app: App, run: WorkflowRun) -> str:
    return workflow_run_topic(app.mode, run.id)


def parse_run_request(app: App, payload: Any) -> tuple[dict[str, Any], str, str]:
    """Validate ``{"inputs", "user", "response_mode"}``; return them (file inputs resolved), the end
    user recorded.

    Raises:
        InvalidParamError: (400 ``invalid_param``) a malformed body, a missing input, a bad file input.
    """
    if not isinstance(payload, Mapping):
        raise InvalidParamError("the request body must be a JSON object")
    inputs = payload.get("inputs", {})
    mode = payload.get("response_mode", "blocking")
    if not isinstance(inputs, Mapping):
        raise InvalidParamError("'inputs' must be an object")
    user = require_user(payload.get("user"))
    if mode not in RESPONSE_MODES:
        raise InvalidParamError(f"'response_mode' must be one of {', '.join(RESPONSE_MODES)}")
    start = Graph(app.graph).start
    checked = dict(inputs)
    for variable in start.config.get("variables", []):
        name = variable["name"]
        if variable.get("required", False) and name not in inputs and "default" not in variable:
            raise InvalidParamError(f"input {name!r} is required")
        if name in inputs and variable.get("type") in ("file", "file-list"):
            checked[name] = _file_input(app, variable, inputs[name])
    end_user_service.ensure(app, user)
    return checked, user, mode


def _file_input(app: App, variable: Mapping[str, Any], value: Any) -> Any:
    """A file input of a run (Dify's ``InputFileObject``, or a list of them), its uploads resolved.

    Raises:
        InvalidParamError: not a file object (list), more files than the variable takes, or an upload
            this app does not have.
    """
    name = variable["name"]
    if variable["type"] == "file":
        return file_service.resolve(app, value, f"input {name!r}")
    limit = variable.get("number_limits") or WORKFLOW_FILE_UPLOAD_LIMIT
    if not isinstance(value, list) or len(value) > limit:
        raise InvalidParamError(f"input {name!r} must be a list of at most {limit} file objects")
    return [file_service.resolve(app, item, f"input {name!r}") for item in value]


def new_run(app: App, inputs: dict[str, Any], user: str) -> WorkflowRun:
    """A run row and its first attempt's task message in the outbox, added to the session but not
    committed: the commit that accepts the run records the message too (``api.services.task_queue``).

    Raises:
        TooManyRequestsError: (429) the app has ``APP_MAX_ACTIVE_REQUESTS`` runs active (``limits``).
    """
    limits.check_active_runs(app)
    now = time.time()
    run = WorkflowRun(
        app_id=app.id,
        end_user=user,
        inputs_json=json.dumps(inputs),
        attempt_id=run_store.new_attempt_id(),
        dispatched_at=now,
    )
    db.session.add(run)
    db.session.flush()  # the run's ids; the message's row refers to it
    run_recovery.run_log_fields(app, run)  # (remembered: lines about the run carry its ids from here on)
    assert run.attempt_id is not None
    db.session.add(TaskOutbox(**task_outbox.values(run.id, run.attempt_id, None, now + dispatch_grace())))
    return run


def dispatch_grace() -> float:
    """Seconds a queued attempt's message waits for its request to send it before the dispatcher may."""
    return _config().WORKFLOW_DISPATCH_GRACE


def create_run(app: App, inputs: dict[str, Any], user: str) -> WorkflowRun:
    run = new_run(app, inputs, user)
    db.session.commit()
    return run


def dispatch(run: WorkflowRun, resume_form: Mapping[str, Any] | None = None) -> None:
    """Send the task message of the run's current attempt, recorded in the outbox with the attempt.

    The action that queued the attempt is already accepted: a broker that cannot take the message now
    leaves it to the dispatcher, which sends it when the broker answers (within the start deadline).
    """
    task_queue.send_now(run, resume_form)


def abandon(run: WorkflowRun, error: str) -> None:
    """Fail a run that could not be started (its request answers 503), and end its topic if possible.

    If the stream store is away, the end stays pending and the reaper writes it later.
    """
    if run_store.finish(run.id, "failed", outputs=None, error=error, steps=run.total_steps):
        db.session.refresh(run)
        app = db.session.get(App, run.app_id)
        assert app is not None
        run_recovery.repair_end(app, run)


def run_blocking(app: App, run: WorkflowRun, *, replay: bool = False) -> dict[str, Any]:
    """Dispatch and wait for the run to finish or pause, reading its own event stream; with ``replay``
    (a retried request of the same ``Idempotency-Key``) the run was dispatched before: only wait.

    The row is authoritative (the worker records the outcome before the stream's end), so while the
    stream is quiet the row is checked too, together with the run's lease and start deadline: a run
    whose worker died ends here as failed instead of keeping the request until its timeout.
    """
    config = _config()
    deadline = time.monotonic() + config.BLOCKING_RESPONSE_TIMEOUT
    check_every = max(0.5, config.WORKFLOW_LEASE_TTL / 3)
    # A replay looks at the row at once: the run may have ended before the subscription began.
    next_check = time.monotonic() + (0 if replay else check_every)
    dispatched = replay
    try:
        # Subscribe before dispatching: the run cannot get ahead of the reader.
        reader = MessageGenerator.retrieve_events(event_transport(), topic_name(app, run), StartAt.TAIL)
        with reader as subscription:
            if not dispatched:
                dispatch(run)
                dispatched = True
            while (remaining := deadline - time.monotonic()) > 0:
                record = subscription.receive(timeout=min(remaining, 1.0))
                if record is CLOSED:
                    break
                if record is not None:
                    if event_name(record.payload) in ("workflow_finished", "workflow_paused"):
                        break
                    continue
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + check_every
                    db.session.refresh(run)
                    run_recovery.check_run(app, run)
                    db.session.commit()  # end the read transaction: the next check must see fresh rows
                    if run.status != WorkflowRunStatus.RUNNING.value:
                        break
            else:
                raise RunWaitTimeoutError("the run did not finish in time; it goes on in the background")
    except DurableStreamError as exc:
        logger.warning("run %s: a blocking request found the event stream unavailable: %s", run.id, exc)
        if not dispatched:
            abandon(run, STREAM_FAILED_RUN)
            raise ServiceUnavailableError(STREAM_UNAVAILABLE) from exc
        # The run goes on in its worker: name it, so that the client can follow it up.
        raise ServiceUnavailableError(
            "the event stream became unavailable while waiting for the run; it goes on in the background",
            details={"task_id": run.task_id, "workflow_run_id": run.id},
        ) from exc
    db.session.refresh(run)
    return blocking_response(run)


def checked(app: App, run: WorkflowRun) -> WorkflowRun:
    """``run`` after the checks every reader applies, as the reaper would: an expired lease or start
    deadline ends it, a lost task message is queued again, a pending end is written. A run's truth
    must not depend on whether a worker or a sweep happens to be alive."""
    run_recovery.check_run(app, run)  # (refreshes ``run`` when its row changed)
    # End the read transaction, so that what the checks changed is seen from here on, without
    # expiring what is loaded: every reader of a herd would reload its app and run row right after.
    session = db.session()
    session.expire_on_commit = False
    try:
        session.commit()
    finally:
        session.expire_on_commit = True
    return run


def blocking_response(run: WorkflowRun) -> dict[str, Any]:
    """Dify's blocking answer (``WorkflowFinishedData``, as in ``workflow_finished``); a paused run's also
    names the paused nodes and the forms they wait for."""
    detail = run_detail(run)
    data = {key: detail[key] for key in _BLOCKING_FIELDS}
    data["outputs"] = run.outputs  # null when there are none, as in the run's workflow_finished
    data["created_by"] = created_by(run.app_id, run.end_user)
    data["exceptions_count"] = 0
    data["files"] = []
    if run.status == WorkflowRunStatus.PAUSED.value:
        data.update(pause_details(run))
    return {"workflow_run_id": run.id, "task_id": run.task_id, "data": data}


_BLOCKING_FIELDS = (
    "id",
    "workflow_id",
    "status",
    "outputs",
    "error",
    "elapsed_time",
    "total_tokens",
    "total_steps",
    "created_at",
    "finished_at",
)


def pause_details(run: WorkflowRun) -> dict[str, Any]:
    """``paused_nodes`` and ``reasons`` of a paused run, as its ``workflow_paused`` event told them."""
    state = run.state_after_pause()
    form = state.get("form")
    reasons = [] if form is None else [pause_reason(form)]
    return {"paused_nodes": [state["node_id"]], "reasons": reasons}


def run_detail(run: WorkflowRun) -> dict[str, Any]:
    """``GET /workflows/run/<id>`` as Dify answers it: ``inputs`` is the inputs' JSON text (clients parse
    it), ``outputs`` an object (``{}`` until the run has any: running, paused, stopped, failed)."""
    return {
        "id": run.id,
        "workflow_id": run.app_id,
        "status": run.status,
        "inputs": json.dumps(run.inputs),
        "outputs": run.outputs or {},
        "error": run.error,
        "total_steps": run.total_steps,
        "total_tokens": run.total_tokens or 0,
        "elapsed_time": round(run.elapsed_time, 6),
        "created_at": int(run.created_timestamp),
        "finished_at": int(run.finished_timestamp) if run.finished_timestamp else None,
    }


def run_not_found() -> NotFoundError:
    """Dify's 404 for a run or task it does not know (``not_found``, as its reference documents)."""
    return NotFoundError("Workflow run not found.", code="not_found")


def get_run(app: App, run_id: str, user: str | None) -> WorkflowRun:
    """The app's run ``run_id`` (``user``'s, if given).

    Raises:
        NotFoundError: (404 ``not_found``) no such run of this app (and user).
    """
    if user is not None:
        require_user(user)
    if not could_be_our_id(run_id):
        raise run_not_found()
    run = db.session.get(WorkflowRun, run_id)
    if run is None or run.app_id != app.id or (user is not None and run.end_user != user):
        raise run_not_found()
    return run


def find_run_by_task(app: App, task_id: str, *, or_run_id: bool = False) -> WorkflowRun | None:
    """The app's run of ``task_id``; with ``or_run_id``, ``task_id`` may also be the run's own id (Dify's
    ``/workflow/<workflow_run_id>/events`` names the run, our earlier clients its task)."""
    if not could_be_our_id(task_id):
        return None
    matches = WorkflowRun.task_id == task_id
    if or_run_id:
        matches = or_(matches, WorkflowRun.id == task_id)
    run = db.session.execute(select(WorkflowRun).where(matches).limit(1)).scalars().first()
    return run if run is not None and run.app_id == app.id else None


def get_run_by_task(app: App, task_id: str, user: str | None, *, or_run_id: bool = False) -> WorkflowRun:
    """``find_run_by_task``, for ``user`` if given.

    Raises:
        NotFoundError: (404 ``not_found``) no such run of this app and user.
    """
    if user is not None:
        require_user(user)
    run = find_run_by_task(app, task_id, or_run_id=or_run_id)
    if run is None or (user is not None and run.end_user != user):
        raise run_not_found()
    return run


def strict_end_users() -> bool:
    """``STRICT_END_USER_ACCESS``: only a run's own end user may stop it or answer its forms."""
    return _config().STRICT_END_USER_ACCESS


def stop_run(app: App, task_id: str, user: str, *, own_runs_only: bool = False) -> None:
    """Stop the app's run of ``task_id``, whoever of the app's end users asks (Dify: "the stop applies to
    the task regardless of ``user``"). An unknown or finished task is a success too, as Dify answers it.
    With ``own_runs_only`` (the web app, whose end users are its visitors) or ``STRICT_END_USER_ACCESS``,
    only ``user``'s own runs. Idempotent; a paused run, or one whose attempt no worker has claimed yet, is
    ended here; a running one by its worker.

    Raises:
        NotFoundError: (404 ``not_found``) only the user's own runs may be stopped, and this is none.
    """
    if own_runs_only:
        run: WorkflowRun | None = get_run_by_task(app, task_id, user)
    else:
        require_user(user)
        run = find_run_by_task(app, task_id)
        if run is None:
            return
        if strict_end_users() and run.end_user != user:
            raise run_not_found()
    assert run is not None
    if run.run_status.is_terminal:
        return
    # The flag and, for a run no worker executes (paused, or queued and not yet claimed), its end: one
    # transaction, so that the stop is whole whatever dies next. Its topic's end follows (or the reaper's).
    redis = app_redis()
    if redis is not None:
        # On the Redis profile the worker's graphon hears it at once (its command channel); the flag
        # below is what every profile and the run's row keep.
        try:
            send_abort(redis, run.id, "stopped by user")
        except RedisError:
            logger.warning("run %s: the stop could not go through Redis; the stop flag carries it", run.id)
    if run_store.stop(run.id, "stopped by user", run.total_steps) is not None:
        db.session.refresh(run)
        logger.info("run %s: stopped while no worker executed it", run.id)
        run_recovery.repair_end(app, run)  # a failure leaves the end pending for the reaper
