"""API errors: what services raise and the HTTP layer turns into ``{"code", "message", "status"}`` bodies.

A utility of the app (like Dify's ``libs/exception.py``): services, the request limits and the error
handler share them, so they live below all of those."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status = 400
    code = "invalid_param"
    #: Seconds a client should wait before trying again (sent as ``Retry-After``), if it should.
    retry_after: int | None = None

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: Extra members of the JSON error body (e.g. the run row with a 410).
        self.details = details or {}
        if code is not None:
            self.code = code


class InvalidParamError(ServiceError):
    status = 400
    code = "invalid_param"


class UnauthorizedError(ServiceError):
    status = 401
    code = "unauthorized"


class NotFoundError(ServiceError):
    status = 404
    code = "not_found"


class ConflictError(ServiceError):
    status = 409
    code = "conflict"


class PreconditionFailedError(ServiceError):
    """The thing exists but is past the state the request needs (a form already answered or expired)."""

    status = 412
    code = "precondition_failed"


class UnprocessableError(ServiceError):
    status = 422
    code = "unprocessable"


class GoneError(ServiceError):
    status = 410
    code = "gone"


class RunWaitTimeoutError(ServiceError):
    status = 504
    code = "timeout"


class ServiceUnavailableError(ServiceError):
    status = 503
    code = "stream_unavailable"
    #: Outages of a store or the queue are usually short: a client should come back soon, not at once.
    #: Under gunicorn's 2 s keep-alive, so a client that waits it out can still reuse its connection.
    retry_after = 1


#: What a client is told when the event stream's store cannot be reached (the detail goes to the log).
STREAM_UNAVAILABLE = "the event stream is unavailable; try again shortly"
#: What a run's row and its ``workflow_finished`` say when its events could not be written.
STREAM_FAILED_RUN = "the event stream was unavailable"


class ServerBusyError(ServiceUnavailableError):
    """This API worker cannot take another event stream now (too many starting, or its loop is behind):
    refused before any work, with a ``Retry-After`` spread at random so that a herd comes back spread."""

    code = "server_busy"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EventStreamBusyError(ServiceUnavailableError):
    """This API worker holds as many event streams as its Redis pool has connections: try again soon."""

    status = 503
    code = "event_stream_busy"
    retry_after = 1


class TooManyRequestsError(ServiceError):
    """A per-tenant limit is reached (api.services.limits): 429, with the seconds after which a try may pass.

    ``limit`` names which one (``active_runs``, ``run_starts``, ``passports``, ``sse_streams_per_end_user``,
    ``sse_streams_per_key``, ``gateway_streams``, ``gateway_bytes``); it is in the body as ``limit``.
    ``rate_limit_error`` is Dify's code for its 429s.
    """

    status = 429
    code = "rate_limit_error"

    def __init__(self, message: str, *, limit: str, retry_after: int) -> None:
        super().__init__(message, details={"limit": limit})
        self.limit = limit
        self.retry_after = max(1, retry_after)
