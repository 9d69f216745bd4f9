"""What the client raises: one class per answer a caller handles differently.

Every HTTP error of the API is a JSON body ``{"code", "message", "status", …}``; :func:`api_error`
turns one into the matching :class:`ApiError` subclass. Only :class:`ServiceUnavailableError`
(5xx) is retried by the client; the others describe a request that cannot succeed as it is.
"""

from __future__ import annotations

from typing import Any

from .models import RunDetail


class ClientError(Exception):
    """Base class of everything this package raises."""


class ApiError(ClientError):
    """The API answered with an error body."""

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        #: The whole JSON body, with any extra members (e.g. the run row of a 410).
        self.body: dict[str, Any] = body or {}


class InvalidRequestError(ApiError):
    """400: a malformed body, user or parameter."""


class InvalidResumeTokenError(InvalidRequestError):
    """400 ``invalid_resume_token``: the ``Last-Event-ID`` is malformed, tampered, or another run's."""


class InvalidFormDataError(InvalidRequestError):
    """400 ``invalid_form_data``: a form's field is missing or of the wrong type, or the action is unknown."""


class AuthenticationError(ApiError):
    """401: a missing or wrong API key or passport."""


class NotFoundError(ApiError):
    """404: an unknown task, run or site code, or one that belongs to another app or end user."""


class ConflictError(ApiError):
    """409: e.g. human input for a run that is not paused."""


class FormClosedError(ApiError):
    """412: the form no longer accepts a submission (:class:`FormSubmittedError`, :class:`FormExpiredError`)."""


class FormSubmittedError(FormClosedError):
    """412 ``human_input_form_submitted``: the form was already submitted."""


class FormExpiredError(FormClosedError):
    """412 ``human_input_form_expired``: the form's ``expiration_time`` passed."""


class IdempotencyKeyReusedError(ApiError):
    """422 ``idempotency_key_reused``: the ``Idempotency-Key`` already started a run with another body."""


class RequestTooLargeError(ApiError):
    """413: the body is over the server's limit."""


class EventsGoneError(ApiError):
    """410: the events the stream would continue with are no longer retained.

    ``code`` is ``resume_cursor_expired`` (the position after the last event seen was removed by
    retention) or ``run_events_lost`` (the retained events are not the whole run). :attr:`run` is
    the run's row as the server had it then, so a caller can still show the outcome.
    """

    def __init__(self, status: int, code: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(status, code, message, body)
        raw = self.body.get("run")
        self.run: RunDetail | None = RunDetail.from_json(raw) if isinstance(raw, dict) else None


class ServiceUnavailableError(ApiError):
    """5xx (e.g. 503 ``event_stream_busy``, ``stream_unavailable``); retried within the budget."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        body: dict[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, message, body)
        #: The server's ``Retry-After``, in seconds, if it sent one.
        self.retry_after = retry_after


class ProtocolError(ClientError):
    """The server's answer is not what the API sends (e.g. not JSON, or not an event stream)."""


class ConnectionLostError(ClientError):
    """The retry budget ran out before the stream or request could be completed.

    ``last_event_id`` is where a later :meth:`follow` (``after=…``) can continue from.
    """

    def __init__(self, message: str, *, attempts: int, last_event_id: str | None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.last_event_id = last_event_id


_BY_STATUS: dict[int, type[ApiError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    410: EventsGoneError,
    412: FormClosedError,
    413: RequestTooLargeError,
}
_BY_CODE: dict[tuple[int, str], type[ApiError]] = {
    (400, "invalid_resume_token"): InvalidResumeTokenError,
    (400, "invalid_form_data"): InvalidFormDataError,
    (412, "human_input_form_submitted"): FormSubmittedError,
    (412, "human_input_form_expired"): FormExpiredError,
    (422, "idempotency_key_reused"): IdempotencyKeyReusedError,
}


def api_error(status: int, body: Any, *, retry_after: float | None = None) -> ApiError:
    """The error an answer of ``status`` with JSON ``body`` stands for (any body shape is accepted)."""
    fields: dict[str, Any] = body if isinstance(body, dict) else {}
    code = str(fields.get("code") or f"http_{status}")
    message = str(fields.get("message") or f"the server answered {status}")
    if status >= 500:
        return ServiceUnavailableError(status, code, message, fields, retry_after=retry_after)
    by_code = _BY_CODE.get((status, code))
    if by_code is not None:
        return by_code(status, code, message, fields)
    return _BY_STATUS.get(status, ApiError)(status, code, message, fields)
