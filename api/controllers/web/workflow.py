"""Workflow endpoints of the web app: run, stop, and the resumable events stream."""

from __future__ import annotations

from typing import Any

from flask import request
from flask_restful import Resource

from api.controllers.service_api.workflow import event_stream_response, last_event_id
from api.models import App
from api.services import workflow_event_service as event_streams
from api.services import workflow_run_service as runs
from api.services.errors import InvalidParamError

from . import api
from .passport import validate_passport


class WebWorkflowRunApi(Resource):  # type: ignore[misc]
    @validate_passport
    def post(self, app_model: App, end_user: str) -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise InvalidParamError("the request body must be a JSON object")
        inputs, user, mode = runs.parse_run_request(app_model, {**body, "user": end_user})
        run = runs.create_run(app_model, inputs, user)
        if mode == "async":
            runs.dispatch(run)
            return {"task_id": run.task_id, "workflow_run_id": run.id}, 202
        if mode == "streaming":
            return event_stream_response(event_streams.run_streaming(app_model, run))
        return runs.run_blocking(app_model, run)


class WebWorkflowTaskStopApi(Resource):  # type: ignore[misc]
    @validate_passport
    def post(self, app_model: App, end_user: str, task_id: str) -> Any:
        runs.stop_run(app_model, task_id, end_user)
        return {"result": "success"}


class WebWorkflowEventsApi(Resource):  # type: ignore[misc]
    @validate_passport
    def get(self, app_model: App, end_user: str, task_id: str) -> Any:
        run = runs.get_run_by_task(app_model, task_id, end_user)
        return event_stream_response(
            event_streams.reconnect(
                app_model,
                run,
                last_event_id=last_event_id(),
                continue_on_pause=request.args.get("continue_on_pause", "").lower() in ("1", "true", "yes"),
            )
        )


api.add_resource(WebWorkflowRunApi, "/workflows/run")
api.add_resource(WebWorkflowTaskStopApi, "/workflows/tasks/<string:task_id>/stop")
api.add_resource(WebWorkflowEventsApi, "/workflow/<string:task_id>/events")
