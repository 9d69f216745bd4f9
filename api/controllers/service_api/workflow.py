"""Workflow endpoints of the service API."""

from __future__ import annotations

from typing import Any

from flask import request
from flask_restful import Resource

from api.controllers.common.workflow_responses import admitted_stream, run_events, start_run
from api.libs.errors import InvalidParamError, NotFoundError
from api.models import App
from api.services import human_input_service as forms
from api.services import limits, workflow_log_service
from api.services import workflow_run_service as runs
from api.services.validation import could_be_our_id, require_user

from .blueprint import api
from .wraps import validate_app_token


def _json_body() -> Any:
    body = request.get_json(silent=True)
    if body is None:
        raise InvalidParamError("the request body must be valid JSON")
    return body


class WorkflowRunApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def post(self, app_model: App) -> Any:
        body = _json_body()
        limits.check_run_start(app_model)
        return start_run(app_model, body)


class WorkflowVersionRunApi(Resource):  # type: ignore[misc]
    """``POST /workflows/<workflow_id>/run``: a run of a given published version. An app here has one,
    whose id is the ``workflow_id`` of its events."""

    @validate_app_token
    def post(self, app_model: App, workflow_id: str) -> Any:
        if not could_be_our_id(workflow_id):
            raise InvalidParamError("Invalid workflow ID format", code="bad_request")
        if workflow_id != app_model.id:
            raise NotFoundError(f"Workflow not found with id: {workflow_id}", code="not_found")
        body = _json_body()
        limits.check_run_start(app_model)
        return start_run(app_model, body)


class WorkflowLogsApi(Resource):  # type: ignore[misc]
    """``GET /workflows/logs``: the app's runs, newest first (``page``, ``limit``, filters)."""

    @validate_app_token
    def get(self, app_model: App) -> Any:
        return workflow_log_service.logs(app_model, request.args)


class WorkflowRunDetailApi(Resource):  # type: ignore[misc]
    """``GET /workflows/run/<id>``: any run of the key's app, as Dify documents it; ``?user=`` narrows
    it to that end user's runs (another's is 404)."""

    @validate_app_token
    def get(self, app_model: App, workflow_run_id: str) -> Any:
        user = request.args.get("user")
        run = runs.get_run(app_model, workflow_run_id, None if user is None else user)
        return runs.run_detail(runs.checked(app_model, run))


class WorkflowTaskStopApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def post(self, app_model: App, task_id: str) -> Any:
        body = _json_body()
        runs.stop_run(app_model, task_id, require_user(body.get("user") if isinstance(body, dict) else None))
        return {"result": "success"}


class WorkflowHumanInputApi(Resource):  # type: ignore[misc]
    """Our route before form tokens, kept as an alias: answers the paused run's open form."""

    @validate_app_token
    def post(self, app_model: App, workflow_run_id: str) -> Any:
        run = forms.submit_by_run(app_model, workflow_run_id, _json_body())
        return {"result": "success", "task_id": run.task_id, "workflow_run_id": run.id, "status": run.status}


class HumanInputFormApi(Resource):  # type: ignore[misc]
    """``/form/human_input/<form_token>``: read a paused run's form, and answer it."""

    @validate_app_token
    def get(self, app_model: App, form_token: str) -> Any:
        form, _ = forms.open_form(app_model, form_token)
        return forms.definition(form)

    @validate_app_token
    def post(self, app_model: App, form_token: str) -> Any:
        forms.submit(app_model, form_token, _json_body())
        return {}


class WorkflowEventsApi(Resource):  # type: ignore[misc]
    """``GET /workflow/<id>/events`` (run or task id): (re)attach to a run's events; ``Last-Event-ID`` resumes."""

    @admitted_stream
    @validate_app_token
    def get(self, app_model: App, task_id: str) -> Any:
        user = request.args.get("user")
        if not user:
            raise InvalidParamError("the 'user' query parameter is required")
        with limits.counting_resume_refusals(app_model):
            return run_events(app_model, task_id, user)


api.add_resource(WorkflowRunApi, "/workflows/run")
api.add_resource(WorkflowVersionRunApi, "/workflows/<string:workflow_id>/run")
api.add_resource(WorkflowLogsApi, "/workflows/logs")
api.add_resource(WorkflowEventsApi, "/workflow/<string:task_id>/events")
api.add_resource(WorkflowRunDetailApi, "/workflows/run/<string:workflow_run_id>")
api.add_resource(WorkflowTaskStopApi, "/workflows/tasks/<string:task_id>/stop")
api.add_resource(WorkflowHumanInputApi, "/workflows/runs/<string:workflow_run_id>/human-input")
api.add_resource(HumanInputFormApi, "/form/human_input/<string:form_token>")
