"""The decisions of a call and of a stream across its connections, without I/O.

The blocking and asyncio clients drive these the sans-IO way: they send the request named here,
feed back what happened (an answer, a message, a failure) and wait as long as they are told.
Whether to send again, how long to wait, which failures end a stream and which ``Last-Event-ID``
a reconnect sends are decided here, once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, SSEError

from .common import ReconnectHook, ReconnectInfo
from .errors import ApiError, ConnectionLostError, ServiceUnavailableError
from .events import Event
from .protocol import IDEMPOTENCY_HEADER, Request, Routes, StreamState, error_of_answer, json_body, was_replayed
from .retry import Backoff, RetryPolicy

#: A connection open this long was useful even if it only carried pings (a paused run's stream).
HEALTHY_AFTER = 5.0


class StreamEnded(Exception):
    """A response ended cleanly before the stream was over (and the stream did not plan to go on)."""

    def __init__(self) -> None:
        super().__init__("the server ended the response before the run's end")


#: What may end one connection of a stream without ending the stream (see :meth:`StreamSession.failed`).
RECONNECTABLE: tuple[type[Exception], ...] = (StreamEnded, ServiceUnavailableError, httpx.TransportError, SSEError)


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


def sent_before_failing(failure: BaseException) -> bool:
    """Whether a transport failure may have happened after the request reached the server."""
    return not isinstance(failure, httpx.ConnectError)


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """What follows an attempt of a :class:`Call`: its answer ``body``, or a wait of ``delay`` seconds
    and the same request again."""

    body: dict[str, Any] | None = None
    delay: float = 0.0
    #: The answer is a replay of a run an earlier request with the same ``Idempotency-Key`` started.
    replayed: bool = False

    @property
    def answer(self) -> dict[str, Any]:
        assert self.body is not None, "only the step that ends a call is read"
        return self.body


class Call:
    """One request, sent again within the budget where that is safe."""

    def __init__(self, request: Request, policy: RetryPolicy) -> None:
        self.request = request
        self._backoff = Backoff(policy)

    def answered(self, status: int, headers: Mapping[str, str], content: bytes) -> Step:
        """The server answered.

        Raises:
            ApiError: The API's error answer, when sending the request again cannot help.
            ProtocolError: A 2xx answer that is not a JSON object.
        """
        if 200 <= status < 300:
            return Step(body=json_body(status, content), replayed=was_replayed(headers))
        error = error_of_answer(status, headers, content)
        if not is_resendable(self.request, error):
            raise error
        return self._again(error)

    def failed(self, failure: httpx.TransportError) -> Step:
        """The request got no answer.

        Raises:
            ConnectionLostError: It may have taken effect (and is not idempotent), or the budget ran out.
        """
        if not self.request.idempotent and sent_before_failing(failure):
            raise lost(failure, 1, None, started=True) from failure
        return self._again(failure)

    def _again(self, failure: Exception) -> Step:
        delay = self._backoff.next_delay(getattr(failure, "retry_after", None))
        if delay is None:
            raise lost(failure, self._backoff.failures, None) from failure
        return Step(delay=delay)


class StreamSession:
    """One logical event stream across as many connections as it takes: the request of the next
    connection, the events of each, and what a connection's end or failure means."""

    def __init__(
        self,
        routes: Routes,
        first: Request,
        user: str | None,
        state: StreamState,
        *,
        policy: RetryPolicy,
        on_reconnect: ReconnectHook | None,
    ) -> None:
        self.routes = routes
        self.user = user
        self.state = state
        #: The request of the next connection.
        self.request = first
        #: The key of the run's POST, if it sent one (a resend carries the same).
        self.idempotency_key = first.headers.get(IDEMPOTENCY_HEADER) if first.method == "POST" else None
        #: How many times the stream reconnected after a failure.
        self.reconnects = 0
        self._on_reconnect = on_reconnect
        self._backoff = Backoff(policy)
        self._opened = 0.0

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def posting(self) -> bool:
        """The next connection sends the run's POST again: the run is not known yet."""
        return self.request.method == "POST" and self.state.path_id is None

    @property
    def run_to_fetch(self) -> str | None:
        """The run whose row may be asked for (the web app has no run endpoint)."""
        return self.state.workflow_run_id if self.routes.with_user else None

    def connected(self, headers: Mapping[str, str]) -> None:
        """A connection's response began (200)."""
        self.state.on_connected(headers)
        self._opened = time.monotonic()

    def received(self, sse: ServerSentEvent) -> Event | None:
        """A message of the current connection; the run's event it delivers, if any (see
        :meth:`StreamState.on_message` for what it raises)."""
        event = self.state.on_message(sse)
        if event is not None or time.monotonic() - self._opened >= HEALTHY_AFTER:
            self._backoff.succeeded()
        return event

    def ended(self) -> None:
        """The response ended cleanly: the stream is over, or goes on with the next :attr:`request`.

        Raises:
            StreamEnded: The response ended too early; a failure like any other (:meth:`failed`).
        """
        if self.state.on_response_end():
            self.request = self._resume_request()  # a planned continuation (after a pause): no failure
        elif not self.state.done:
            raise StreamEnded()

    def failed(self, failure: Exception) -> bool:
        """A connection failed with one of :data:`RECONNECTABLE`; whether it broke right after a pause,
        so that the stream is over if the run is still paused (then call :meth:`finish`), else
        call :meth:`reconnect`.

        A run's POST that failed before the run was known is sent again only when that cannot start
        a second run: it carries an ``Idempotency-Key`` (the server answers for the run the first
        one started, its stream from the start), or it never reached the server (connection refused,
        or a 503 of a server that dispatched nothing).

        Raises:
            ServiceUnavailableError: A run's POST refused in a way that does not allow sending it again.
            ConnectionLostError: A run's POST failed after it was sent: the run may or may not exist.
        """
        state = self.state
        if self.posting and not self.request.idempotent:
            if isinstance(failure, ServiceUnavailableError):
                if not is_resendable(self.request, failure):
                    raise failure
            elif isinstance(failure, StreamEnded) or sent_before_failing(failure):
                raise lost(failure, 1, None, started=True) from failure
        if isinstance(failure, ServiceUnavailableError | StreamEnded):
            return False
        return state.after_pause and not state.continue_on_pause

    def finish(self) -> None:
        """The stream broke after a pause and the run is still paused: it is over, as the server would have ended it."""
        self.state.done = True

    def reconnect(self, failure: Exception) -> float:
        """Record the failure; the seconds to wait before connecting to the next :attr:`request`.

        Calls the ``on_reconnect`` hook first.

        Raises:
            ConnectionLostError: The retry budget ran out.
        """
        state = self.state
        self._backoff.server_retry = state.server_retry
        delay = self._backoff.next_delay(getattr(failure, "retry_after", None))
        if delay is None:
            raise lost(failure, self._backoff.failures, state.last_event_id) from failure
        self.reconnects += 1
        if self._on_reconnect is not None:
            self._on_reconnect(ReconnectInfo(self.reconnects, delay, failure, state.last_event_id))
        if state.path_id is not None:
            self.request = self._resume_request()
        return delay

    def _resume_request(self) -> Request:
        state = self.state
        assert state.path_id is not None
        return self.routes.events(
            state.path_id,
            self.user,
            last_event_id=state.last_event_id,
            continue_on_pause=state.continue_on_pause,
            from_start=state.from_start,
        )


class StreamView:
    """What a caller reads of a stream in either flavour: its position and the run's ids."""

    def __init__(self, session: StreamSession) -> None:
        self._session = session

    @property
    def last_event_id(self) -> str | None:
        return self._session.state.last_event_id

    @property
    def task_id(self) -> str | None:
        return self._session.state.task_id

    @property
    def workflow_run_id(self) -> str | None:
        return self._session.state.workflow_run_id

    @property
    def reconnects(self) -> int:
        """How many times the stream reconnected after a failure."""
        return self._session.reconnects

    @property
    def idempotency_key(self) -> str | None:
        """The ``Idempotency-Key`` of the run's POST (``None`` for a stream that follows a run, or none sent)."""
        return self._session.idempotency_key

    @property
    def replayed(self) -> bool:
        """The server answered the run's POST for a run an earlier POST with the same key started."""
        return self._session.state.replayed
