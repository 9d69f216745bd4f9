"""What the service API says of the key's app (``/parameters``, ``/info``, ``/meta``, ``/site``), its end
users (``/end-users/<id>``), and the routes of Dify's other app types, which a workflow app's key cannot use."""

from __future__ import annotations

from typing import Any

from flask_restful import Resource

from api.libs.errors import InvalidParamError
from api.models import App
from api.services import app_info_service, end_user_service

from .blueprint import api
from .wraps import validate_app_token


class AppParametersApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def get(self, app_model: App) -> Any:
        return app_info_service.parameters(app_model)


class AppInfoApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def get(self, app_model: App) -> Any:
        return app_info_service.info(app_model)


class AppMetaApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def get(self, app_model: App) -> Any:
        return app_info_service.meta(app_model)


class AppSiteApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def get(self, app_model: App) -> Any:
        return app_info_service.site(app_model)


class EndUserApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def get(self, app_model: App, end_user_id: str) -> Any:
        return end_user_service.detail(app_model, end_user_id)


def _not_chat_app() -> InvalidParamError:
    return InvalidParamError("Please check if your app mode matches the right API route.", code="not_chat_app")


def _app_unavailable() -> InvalidParamError:
    return InvalidParamError("App unavailable, please check your app configurations.", code="app_unavailable")


class ChatAppRouteApi(Resource):  # type: ignore[misc]
    """A chat app's route (messages, conversations, feedback): a workflow app's key gets Dify's 400
    ``not_chat_app``, after its key is checked."""

    @validate_app_token
    def get(self, app_model: App, **_: str) -> Any:
        raise _not_chat_app()

    @validate_app_token
    def post(self, app_model: App, **_: str) -> Any:
        raise _not_chat_app()

    @validate_app_token
    def put(self, app_model: App, **_: str) -> Any:
        raise _not_chat_app()

    @validate_app_token
    def delete(self, app_model: App, **_: str) -> Any:
        raise _not_chat_app()


class CompletionAppRouteApi(Resource):  # type: ignore[misc]
    """A completion app's route: Dify answers any other app's key 400 ``app_unavailable``."""

    @validate_app_token
    def post(self, app_model: App, **_: str) -> Any:
        raise _app_unavailable()


api.add_resource(AppParametersApi, "/parameters")
api.add_resource(AppInfoApi, "/info")
api.add_resource(AppMetaApi, "/meta")
api.add_resource(AppSiteApi, "/site")
api.add_resource(EndUserApi, "/end-users/<string:end_user_id>")
api.add_resource(
    ChatAppRouteApi,
    "/chat-messages",
    "/chat-messages/<string:task_id>/stop",
    "/messages",
    "/messages/<string:message_id>/suggested",
    "/messages/<string:message_id>/feedbacks",
    "/app/feedbacks",
    "/conversations",
    "/conversations/<string:conversation_id>",
    "/conversations/<string:conversation_id>/name",
    "/conversations/<string:conversation_id>/variables",
    "/conversations/<string:conversation_id>/variables/<string:variable_id>",
)
api.add_resource(CompletionAppRouteApi, "/completion-messages", "/completion-messages/<string:task_id>/stop")
