"""Small pieces both clients share: timeouts, the reconnect note, when to resend, the lost-connection error."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from .errors import ApiError, ConnectionLostError, ServiceUnavailableError
from .models import Passport, RunDetail, RunOutcome
from .protocol import Request

#: Seconds without a byte after which a connection counts as dead: several server pings (10 s apart by default).
DEFAULT_READ_TIMEOUT = 45.0
#: A connection open this long was useful even if it only carried pings (a paused run's stream).
HEALTHY_AFTER = 5.0


def timeouts(read_timeout: float) -> httpx.Timeout:
    return httpx.Timeout(10.0, read=read_timeout)


@dataclasses.dataclass(frozen=True, slots=True)
class ReconnectInfo:
    """Passed to ``on_reconnect`` before a stream reconnects."""

    #: The stream's reconnects so far, this one included.
    attempt: int
    #: Seconds until the reconnect.
    delay: float
    #: What ended the previous connection.
    error: BaseException
    #: The ``Last-Event-ID`` the reconnect sends.
    last_event_id: str | None


class StreamEnded(Exception):
    """A response ended cleanly before the stream was over; ``planned`` if that is no failure
    (a streaming run that paused, continued with ``continue_on_pause``)."""

    def __init__(self, planned: bool) -> None:
        super().__init__("the server ended the response before the run's end")
        self.planned = planned


def is_resendable(request: Request, error: ApiError) -> bool:
    """Whether an error answer to ``request`` may be answered by sending it again."""
    if not isinstance(error, ServiceUnavailableError):
        return False
    return request.idempotent or (request.resend_on_503 and error.status == 503)


def lost(
    failure: BaseException, attempts: int, last_event_id: str | None, *, started: bool = False
) -> ConnectionLostError:
    if started:
        message = f"the connection failed after the request was sent ({failure!r}); it may have taken effect"
    else:
        message = f"gave up after {attempts} failed attempts; the last: {failure!r}"
    return ConnectionLostError(message, attempts=attempts, last_event_id=last_event_id)


def outcome_of(body: dict[str, Any]) -> RunOutcome:
    return RunOutcome(str(body["task_id"]), str(body["workflow_run_id"]), RunDetail.from_json(body["data"]))


def passport_of(body: dict[str, Any]) -> Passport:
    return Passport(access_token=str(body["access_token"]), end_user=str(body["end_user"]))
