"""flask-restful ``Api`` that answers every error as ``{"code", "message", "status"}``."""

from __future__ import annotations

import logging
from typing import Any

from flask import Response, jsonify
from flask_restful import Api
from werkzeug.exceptions import HTTPException

from api.services.errors import ServiceError

logger = logging.getLogger(__name__)


def error_response(code: str, message: str, status: int, details: dict[str, Any] | None = None) -> Response:
    response = jsonify({**(details or {}), "code": code, "message": message, "status": status})
    response.status_code = status
    return response


def http_error_response(error: Exception) -> Response:
    if isinstance(error, ServiceError):
        return error_response(error.code, error.message, error.status, error.details)
    if isinstance(error, HTTPException):
        status = error.code or 500
        name = (error.name or "error").lower().replace(" ", "_")
        return error_response(name, error.description or name, status)
    logger.exception("unhandled error", exc_info=error)
    return error_response("internal_server_error", "internal server error", 500)


class ExternalApi(Api):  # type: ignore[misc]
    def handle_error(self, e: Exception) -> Any:
        return http_error_response(e)
