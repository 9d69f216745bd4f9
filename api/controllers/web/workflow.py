"""Workflow endpoints of the web app: run, stop, and the resumable events stream."""

from __future__ import annotations

from typing import Any

from flask import request
from flask_restful import Resource

from api.controllers.common.workflow_responses import run_events, start_run
from api.libs.errors import InvalidParamError
from api.models import App
from api.services import workflow_run_service as runs

from .blueprint import api
from .passport import validate_passport


class WebWorkflowRunApi(Resource):  # type: ignore[misc]
    @validate_passport
    def post(self, app_model: App, end_user: str) -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise InvalidParamError("the request body must be a JSON object")
        return start_run(app_model, {**body, "user": end_user})


class WebWorkflowTaskStopApi(Resource):  # type: ignore[misc]
    @validate_passport
    def post(self, app_model: App, end_user: str, task_id: str) -> Any:
        runs.stop_run(app_model, task_id, end_user)
        return {"result": "success"}


class WebWorkflowEventsApi(Resource):  # type: ignore[misc]
    @validate_passport
    def get(self, app_model: App, end_user: str, task_id: str) -> Any:
        return run_events(app_model, task_id, end_user)


api.add_resource(WebWorkflowRunApi, "/workflows/run")
api.add_resource(WebWorkflowTaskStopApi, "/workflows/tasks/<string:task_id>/stop")
api.add_resource(WebWorkflowEventsApi, "/workflow/<string:task_id>/events")
