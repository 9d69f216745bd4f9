"""Workflow endpoints of the web app: run, stop, the resumable events stream and human-input forms."""

from __future__ import annotations

from typing import Any

from flask import request
from flask_restful import Resource

from api.controllers.common.workflow_responses import admitted_stream, run_events, start_run
from api.libs.errors import InvalidParamError, NotFoundError
from api.models import App
from api.services import human_input_service as forms
from api.services import limits
from api.services import workflow_run_service as runs

from .blueprint import api
from .passport import validate_passport


class WebWorkflowRunApi(Resource):  # type: ignore[misc]
    @validate_passport
    def post(self, app_model: App, end_user: str) -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise InvalidParamError("the request body must be a JSON object")
        limits.check_run_start(app_model)
        return start_run(app_model, {**body, "user": end_user})


class WebWorkflowTaskStopApi(Resource):  # type: ignore[misc]
    @validate_passport
    def post(self, app_model: App, end_user: str, task_id: str) -> Any:
        runs.stop_run(app_model, task_id, end_user, own_runs_only=True)
        return {"result": "success"}


class WebWorkflowEventsApi(Resource):  # type: ignore[misc]
    @admitted_stream
    @validate_passport
    def get(self, app_model: App, end_user: str, task_id: str) -> Any:
        with limits.counting_resume_refusals(app_model):
            return run_events(app_model, task_id, end_user)


class WebHumanInputFormApi(Resource):  # type: ignore[misc]
    """``/form/human_input/<form_token>`` for the web app: the passport's end user answers its run's form."""

    @validate_passport
    def get(self, app_model: App, end_user: str, form_token: str) -> Any:
        form, run = forms.open_form(app_model, form_token)
        if run.end_user != end_user:
            raise NotFoundError("form not found", code="not_found")
        return forms.definition(form)

    @validate_passport
    def post(self, app_model: App, end_user: str, form_token: str) -> Any:
        forms.submit(app_model, form_token, request.get_json(silent=True), user=end_user)
        return {}


api.add_resource(WebWorkflowRunApi, "/workflows/run")
api.add_resource(WebWorkflowTaskStopApi, "/workflows/tasks/<string:task_id>/stop")
api.add_resource(WebWorkflowEventsApi, "/workflow/<string:task_id>/events")
api.add_resource(WebHumanInputFormApi, "/form/human_input/<string:form_token>")
