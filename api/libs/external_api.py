"""flask-restful ``Api`` that answers every error as ``{"code", "message", "status"}``."""

from __future__ import annotations

import logging
from typing import Any

from flask import Response, jsonify, request
from flask_restful import Api
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from werkzeug.exceptions import HTTPException, MethodNotAllowed, RequestEntityTooLarge

from api.libs.errors import STREAM_UNAVAILABLE, ServiceError, ServiceUnavailableError

logger = logging.getLogger(__name__)

#: Errors of the event stream's store that reached no service's own mapping (a process's first use
#: of the store opens its connection, wherever that happens): registered by the extension that owns
#: the store, answered 503 ``stream_unavailable`` like every mapped one.
STREAM_STORE_ERRORS: list[type[Exception]] = []


def error_response(
    code: str, message: str, status: int, details: dict[str, Any] | None = None, *, retry_after: int | None = None
) -> Response:
    response = jsonify({**(details or {}), "code": code, "message": message, "status": status})
    response.status_code = status
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response


def http_error_response(error: Exception) -> Response:
    if isinstance(error, RequestEntityTooLarge):
        limit = request.max_content_length
        return error_response("request_too_large", f"the request body is larger than {limit} bytes", 413)
    if isinstance(error, ServiceError):
        return error_response(error.code, error.message, error.status, error.details, retry_after=error.retry_after)
    if STREAM_STORE_ERRORS and isinstance(error, tuple(STREAM_STORE_ERRORS)):
        logger.warning("the event stream's store is unavailable: %s", error)
        retry_after = ServiceUnavailableError.retry_after
        return error_response("stream_unavailable", STREAM_UNAVAILABLE, 503, retry_after=retry_after)
    if isinstance(error, HTTPException):
        status = error.code or 500
        name = (error.name or "error").lower().replace(" ", "_")
        response = error_response(name, error.description or name, status)
        if isinstance(error, MethodNotAllowed) and error.valid_methods:
            # HTTP requires a 405 to say which methods the resource takes.
            response.headers["Allow"] = ", ".join(sorted(error.valid_methods))
        return response
    if _refused_by_the_database(error):
        # Validation should have answered first; reaching here means a check is missing somewhere.
        logger.warning("the database refused a request value: %s", getattr(error, "orig", error))
        return error_response("invalid_param", "a value in the request cannot be stored or looked up", 400)
    if isinstance(error, PoolTimeoutError):
        # Every connection of this process's pool stayed taken for SQLALCHEMY_POOL_TIMEOUT: the
        # process is overloaded, which a later try may not find.
        logger.warning("no free app database connection: %s", error)
        return error_response("database_busy", "the server is busy; try again shortly", 503, retry_after=1)
    if isinstance(error, OperationalError):
        # The database cannot be reached, or refused the connection or statement for a reason of
        # its own (down, restarting, out of connections, locked).
        logger.warning("the app database is unavailable: %s", getattr(error, "orig", error))
        return error_response(
            "database_unavailable", "the database is unavailable; try again shortly", 503, retry_after=5
        )
    logger.exception("unhandled error", exc_info=error)
    return error_response("internal_server_error", "internal server error", 500)


def _refused_by_the_database(error: Exception) -> bool:
    # DataError: NUL characters, over-long strings, malformed values (SQLSTATE class 22). Drivers
    # raise an unpaired surrogate's UnicodeEncodeError unwrapped, before anything reaches the server.
    if isinstance(error, DataError):
        return True
    return isinstance(error, UnicodeEncodeError) and error.reason == "surrogates not allowed"


class ExternalApi(Api):  # type: ignore[misc]
    def handle_error(self, e: Exception) -> Any:
        return http_error_response(e)
