"""Human-input forms by token (Dify's ``/form/human_input/<form_token>``): read, submit, expire.

A form is opened by the worker when its run pauses (``form_store.open_form``) and ends exactly once:
submitted (the run resumes with the answer), expired (the run resumes with
``human_input_form_timeout`` and fails) or closed (its run was stopped). Whichever party's
conditional update wins decides; the others are answered 412.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Update, select

from api.core.app.apps import form_store, run_store
from api.core.workflow import Graph
from api.core.workflow.forms import InvalidSubmissionError, check_submission, fields_of
from api.core.workflow.graph import Node
from api.libs import log_context
from api.libs.errors import ConflictError, InvalidParamError, NotFoundError, PreconditionFailedError
from api.models import App, HumanInputForm, HumanInputFormStatus, WorkflowRun, WorkflowRunStatus
from api.models.engine import db

from . import file_service, run_recovery
from . import workflow_run_service as runs
from .validation import could_be_credential, require_user

logger = logging.getLogger(__name__)

#: Longest a submission waits for the worker to record the pause its form belongs to (the form's
#: token is visible a moment before the run's row says ``paused``).
PAUSE_WAIT = 5.0
_MAX_TOKEN_LENGTH = 64


def _not_found() -> NotFoundError:
    return NotFoundError("form not found", code="not_found")


def _submitted() -> PreconditionFailedError:
    return PreconditionFailedError("the form has already been submitted", code="human_input_form_submitted")


def _expired() -> PreconditionFailedError:
    return PreconditionFailedError("the form has expired", code="human_input_form_expired")


def definition(form: HumanInputForm) -> dict[str, Any]:
    """``GET /form/human_input/<token>``: what a client needs to show the form."""
    shown = form.definition
    return {
        "form_content": shown["form_content"],
        "inputs": shown["inputs"],
        "resolved_default_values": shown["resolved_default_values"],  # strings already (forms.default_values)
        "user_actions": shown["actions"],
        "expiration_time": shown["expiration_time"],
    }


def open_form(app: App, token: str) -> tuple[HumanInputForm, WorkflowRun]:
    """The form behind ``token`` and its run, if it can still be answered.

    Raises:
        NotFoundError: (404 ``not_found``) no such form of this app.
        PreconditionFailedError: (412) ``human_input_form_submitted`` or ``human_input_form_expired``.
    """
    if not could_be_credential(token, _MAX_TOKEN_LENGTH):
        raise _not_found()
    form = db.session.execute(select(HumanInputForm).where(HumanInputForm.token == token)).scalar_one_or_none()
    if form is None or form.app_id != app.id:
        raise _not_found()
    run = db.session.get(WorkflowRun, form.run_id)
    if run is None:
        raise _not_found()
    _check_open(app, form, run)
    return form, run


def _check_open(app: App, form: HumanInputForm, run: WorkflowRun) -> None:
    if form.status == HumanInputFormStatus.SUBMITTED.value:
        raise _submitted()
    if form.status != HumanInputFormStatus.WAITING.value:
        raise _expired()
    if form.expires_at <= time.time():
        expire(app, form.id, run)
        raise _expired()
    if run.run_status.is_terminal:
        form_store.close(form.id)
        raise _expired()


def submit(app: App, token: str, payload: Any, *, user: str | None = None) -> WorkflowRun:
    """``POST /form/human_input/<token>`` with ``{"inputs", "action", "user"}``: answer the form, resume the run.

    ``user`` is the web app's end user (its passport), who answers only its own runs' forms; the service
    API takes it from the body, and any end user of the app may answer (Dify: the first answer wins).

    Raises:
        InvalidParamError: (400) the body is not a JSON object, or ``user`` is missing or malformed;
            (400 ``invalid_form_data``) the inputs or the action do not match the form.
        NotFoundError: (404 ``not_found``) no such form of this app (with ``STRICT_END_USER_ACCESS``,
            of this end user's runs: otherwise any end user of the app may answer, the first answer wins).
        PreconditionFailedError: (412) the form was already submitted, or expired.
    """
    if not isinstance(payload, Mapping):
        raise InvalidParamError("the request body must be a JSON object")
    own_runs_only = user is not None
    user = require_user(payload.get("user") if user is None else user)
    inputs, action = payload.get("inputs", {}), payload.get("action")
    if not isinstance(inputs, Mapping):
        raise InvalidParamError("'inputs' must be an object", code="invalid_form_data")
    if action is not None and not isinstance(action, str):
        raise InvalidParamError("'action' must be the id of one of the form's actions", code="invalid_form_data")
    form, run = open_form(app, token)
    if run.end_user != user and (own_runs_only or runs.strict_end_users()):
        raise _not_found()
    return answer(app, form, run, inputs, action)


def answer(
    app: App, form: HumanInputForm, run: WorkflowRun, inputs: Mapping[str, Any], action: str | None
) -> WorkflowRun:
    """Check a submission against its form, take the form's answer, and resume the run with it."""
    node = Graph(app.graph).nodes[form.node_id]
    inputs = _resolved_files(app, node, inputs)
    try:
        _, action = check_submission(node, inputs, action, form.definition)
    except InvalidSubmissionError as exc:
        raise InvalidParamError(str(exc), code="invalid_form_data") from exc
    _await_pause(app, form, run)
    submission = {"kind": "submission", "inputs": declared(node, inputs), "action": action}
    # The answer, the run's resumption and its task message: one transaction, all or nothing.
    if not _resume(run, submission, form_store.submit_statement(form.id, action)):
        db.session.refresh(form)
        db.session.refresh(run)
        _check_open(app, form, run)  # raises: someone else answered it, its time is up, or the run ended
        raise _submitted() if form.status == HumanInputFormStatus.SUBMITTED.value else _expired()
    with log_context.bound(run_recovery.run_log_fields(app, run)):
        logger.info("run %s: form %s submitted (%s)", run.id, form.id, action)
    return run


def declared(node: Node, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The submission's values of the form's own fields: nothing undeclared travels in the run's task message."""
    names = {field.name for field in fields_of(node)}
    return {name: value for name, value in inputs.items() if name in names}


def _resolved_files(app: App, node: Node, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The submission with each file of a ``file`` / ``file-list`` field resolved (an upload's name, type, size).

    Raises:
        InvalidParamError: (400 ``invalid_form_data``) a file that is no file object, or an upload this
            app does not have.
    """
    resolved = dict(inputs)
    try:
        for field in fields_of(node):
            value = inputs.get(field.name)
            if field.kind == "file" and isinstance(value, Mapping):
                resolved[field.name] = file_service.resolve(app, value, f"form field {field.name!r}")
            elif field.kind == "file-list" and isinstance(value, list):
                where = f"form field {field.name!r}"
                resolved[field.name] = [
                    file_service.resolve(app, item, where) if isinstance(item, Mapping) else item for item in value
                ]
    except InvalidParamError as exc:
        raise InvalidParamError(exc.message, code="invalid_form_data") from exc
    return resolved


def submit_by_run(app: App, run_id: str, payload: Any) -> WorkflowRun:
    """``POST /workflows/runs/<run_id>/human-input`` (our route before form tokens, kept as an alias):
    answer the open form of a paused run with ``{"user", "inputs", "action"?}``.

    Raises:
        InvalidParamError: (400 ``invalid_param``) a malformed body, or inputs that do not match the form.
        NotFoundError: (404 ``not_found``) no such run of this app and user.
        ConflictError: (409 ``workflow_not_paused``) the run is not waiting for a form.
    """
    if not isinstance(payload, Mapping):
        raise InvalidParamError("the request body must be a JSON object")
    user, inputs, action = require_user(payload.get("user")), payload.get("inputs", {}), payload.get("action")
    if not isinstance(inputs, Mapping):
        raise InvalidParamError("'inputs' must be an object")
    if action is not None and not isinstance(action, str):
        raise InvalidParamError("'action' must be the id of one of the form's actions")
    run = runs.get_run(app, run_id, user)
    if run.status != WorkflowRunStatus.PAUSED.value:
        raise ConflictError(f"the run is {run.status}, not paused", code="workflow_not_paused")
    form = waiting_form(run)
    if form is None:  # paused by a version without form tokens: its state names the node alone
        node = Graph(app.graph).nodes[run.state_after_pause()["node_id"]]
        try:
            check_submission(node, inputs, action)
        except InvalidSubmissionError as exc:
            raise InvalidParamError(str(exc)) from exc
        if not _resume(run, {"kind": "submission", "inputs": declared(node, inputs), "action": action}):
            raise ConflictError("the run was resumed or stopped concurrently", code="workflow_not_paused")
        return run
    try:
        return answer(app, form, run, inputs, action)
    except InvalidParamError as exc:
        raise InvalidParamError(exc.message) from exc
    except PreconditionFailedError as exc:
        raise ConflictError(f"the run's form is no longer open ({exc.code})", code="workflow_not_paused") from exc


def _await_pause(app: App, form: HumanInputForm, run: WorkflowRun) -> None:
    """Wait (briefly) until the worker has recorded the pause whose form is being answered.

    A form answered meanwhile by someone else is that answer's 412 (its run goes on, or has ended).
    """
    deadline = time.monotonic() + PAUSE_WAIT
    while run.status == WorkflowRunStatus.RUNNING.value and time.monotonic() < deadline:
        time.sleep(0.05)
        db.session.commit()  # end the read transaction: the next read must see the worker's update
        db.session.refresh(run)
        db.session.refresh(form)
        if form.status != HumanInputFormStatus.WAITING.value:
            _check_open(app, form, run)
    if run.run_status.is_terminal:
        db.session.refresh(form)
        if form.status != HumanInputFormStatus.WAITING.value:
            _check_open(app, form, run)
        raise _expired()
    if run.status != WorkflowRunStatus.PAUSED.value:
        raise ConflictError(f"the run is {run.status}, not paused", code="workflow_not_paused")


def _resume(run: WorkflowRun, submission: dict[str, Any], answer: Update | None = None) -> bool:
    """Resume a paused run with ``submission`` (with ``answer``: only if that form update wins too) and
    send its task message; ``False`` when the run was not paused any more (stopped, resumed, expired)."""
    grace = runs.dispatch_grace()
    if run_store.resume(run.id, submission, send_after=grace, answer=answer) is None:
        return False
    db.session.refresh(run)
    runs.dispatch(run, resume_form=submission)  # a broker that is away leaves it to the dispatcher
    db.session.refresh(run)
    return True


def expire(app: App, form_id: str, run: WorkflowRun) -> bool:
    """End a form whose time is up and resume its run with the timeout; ``False`` if someone else did, or
    if its run has not recorded the pause yet (the next sweep expires it once it has)."""
    db.session.refresh(run)
    if run.status == WorkflowRunStatus.PAUSED.value and _resume(
        run, {"kind": "timeout"}, form_store.expire_statement(form_id)
    ):
        with log_context.bound(run_recovery.run_log_fields(app, run)):
            logger.info("run %s: form %s expired; the run resumes with the timeout", run.id, form_id)
        return True
    if not run.run_status.is_terminal:
        # The attempt opens the form before it records the pause: ending the form alone now would leave
        # the run paused with nothing to resume it. (A resume that won a race has closed the form itself.)
        return False
    return form_store.expire(form_id)  # nothing to resume: the form alone


def expire_overdue() -> int:
    """One sweep: expire every waiting form whose time is up (the reaper runs it). Returns how many."""
    expired = 0
    for form_id, run_id in form_store.overdue():
        run = db.session.get(WorkflowRun, run_id)
        app = None if run is None else db.session.get(App, run.app_id)
        if run is None or app is None:
            continue
        try:
            if expire(app, form_id, run):
                expired += 1
        except Exception:  # the database failed mid-way: the next sweep tries again; go on with the others
            logger.exception("run %s: could not resume after form %s expired", run_id, form_id)
    return expired


def waiting_form(run: WorkflowRun) -> HumanInputForm | None:
    """The open form of a paused run (the newest), if it has one (runs paused by earlier versions have none)."""
    query = (
        select(HumanInputForm)
        .where(HumanInputForm.run_id == run.id, HumanInputForm.status == HumanInputFormStatus.WAITING.value)
        .order_by(HumanInputForm.created_at.desc())
        .limit(1)
    )
    return db.session.execute(query).scalar_one_or_none()
