"""The blocking client: :class:`Client` (service API, API key) and :class:`WebClient` (web app, passport).

Both stream a run's events as an :class:`EventStream`, which reconnects by itself: see
:mod:`durable_workflow_client.protocol` for the rules and :mod:`durable_workflow_client.retry` for
the budget.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any, Literal, Self, overload

import httpx
from httpx_sse import EventSource, SSEError

from .common import (
    DEFAULT_READ_TIMEOUT,
    HEALTHY_AFTER,
    ReconnectInfo,
    StreamEnded,
    is_resendable,
    lost,
    outcome_of,
    passport_of,
    timeouts,
)
from .errors import ApiError, ConnectionLostError, EventsGoneError, ServiceUnavailableError
from .events import Event
from .models import HumanInputAccepted, Passport, RunDetail, RunHandle, RunOutcome
from .protocol import SERVICE_ROUTES, WEB_ROUTES, Request, Routes, StreamState, error_of_answer, json_body
from .retry import Backoff, RetryPolicy

ReconnectHook = Callable[[ReconnectInfo], None]


class EventStream(Iterator[Event]):
    """A run's events, exactly once and in order, across as many connections as it takes.

    Iterate it (or use it as a context manager and iterate). :attr:`last_event_id` is the resume
    token of the last event delivered: persist it and pass it as ``after=`` to :meth:`Client.follow`
    to continue in another process.
    """

    def __init__(self, core: ClientCore, state: StreamState, first: Request, user: str | None) -> None:
        self._core = core
        self._state = state
        self._first = first
        self._user = user
        self._events: Generator[Event, None, None] | None = None
        #: How many times the stream reconnected after a failure.
        self.reconnects = 0

    @property
    def last_event_id(self) -> str | None:
        return self._state.last_event_id

    @property
    def task_id(self) -> str | None:
        return self._state.task_id

    @property
    def workflow_run_id(self) -> str | None:
        return self._state.workflow_run_id

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Event:
        if self._events is None:
            self._events = self._run()
        return next(self._events)

    def close(self) -> None:
        """Stop reading (closes the open connection, if any)."""
        if self._events is not None:
            self._events.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()

    def _resume_request(self) -> Request:
        state = self._state
        assert state.task_id is not None
        return self._core.routes.events(
            state.task_id, self._user, last_event_id=state.last_event_id, continue_on_pause=state.continue_on_pause
        )

    def _run(self) -> Generator[Event, None, None]:
        state, core = self._state, self._core
        backoff = Backoff(core.retry)
        request = self._first
        while True:
            try:
                yield from self._connection(request, backoff)
                return
            except StreamEnded as ended:
                if ended.planned:
                    request = self._resume_request()
                    continue
                failure: Exception = ended
            except EventsGoneError as exc:
                raise self._core.with_run(exc, state.workflow_run_id, self._user) from None
            except ServiceUnavailableError as exc:
                if state.task_id is None and not is_resendable(request, exc):
                    raise
                failure = exc
            except (httpx.TransportError, SSEError) as exc:
                if state.task_id is None and not isinstance(exc, httpx.ConnectError):
                    # A run's POST that failed after it was sent: the run may or may not exist.
                    raise lost(exc, 1, None, started=True) from exc
                if state.after_pause and not state.continue_on_pause and self._core.still_paused(state, self._user):
                    state.done = True
                    return
                failure = exc
            backoff.server_retry = state.server_retry
            delay = backoff.next_delay(getattr(failure, "retry_after", None))
            if delay is None:
                raise lost(failure, backoff.failures, state.last_event_id) from failure
            self.reconnects += 1
            if core.on_reconnect is not None:
                core.on_reconnect(ReconnectInfo(self.reconnects, delay, failure, state.last_event_id))
            time.sleep(delay)
            if state.task_id is not None:
                request = self._resume_request()

    def _connection(self, request: Request, backoff: Backoff) -> Generator[Event, None, None]:
        """The events of one connection; returns when the stream is over, raises when it must go on."""
        state = self._state
        response = self._core.open(request)
        try:
            if response.status_code != 200:
                response.read()
                raise error_of_answer(response.status_code, response.headers, response.content)
            state.on_connected(response.headers)
            opened = time.monotonic()
            for sse in EventSource(response).iter_sse():
                event = state.on_message(sse)
                if event is not None or time.monotonic() - opened >= HEALTHY_AFTER:
                    backoff.succeeded()
                if event is not None:
                    yield event
                if state.done:
                    return
        finally:
            response.close()
        planned = state.on_response_end()
        if not state.done:
            raise StreamEnded(planned)


class ClientCore:
    """What both flavours share: the HTTP client, credentials, retries and the stream plumbing."""

    def __init__(
        self,
        base_url: str,
        routes: Routes,
        *,
        retry: RetryPolicy | None,
        read_timeout: float,
        on_reconnect: ReconnectHook | None,
        http_client: httpx.Client | None,
    ) -> None:
        self.routes = routes
        self.retry = retry or RetryPolicy()
        self.on_reconnect = on_reconnect
        self._owns_http = http_client is None
        self.http = http_client or httpx.Client(timeout=timeouts(read_timeout))
        self.base_url = base_url.rstrip("/")

    def auth_headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _build(self, request: Request) -> httpx.Request:
        auth = self.auth_headers() if request.authenticated else {}
        return self.http.build_request(
            request.method,
            self.base_url + request.path,
            params=request.params,
            json=request.json,
            headers={**auth, **request.headers},
        )

    def open(self, request: Request) -> httpx.Response:
        """Send ``request`` and return the response with its body not yet read (close it)."""
        built = self._build(request)
        built.headers["Accept"] = "text/event-stream"
        built.headers["Cache-Control"] = "no-store"
        return self.http.send(built, stream=True)

    def call(self, request: Request) -> dict[str, Any]:
        """Send ``request`` (again, within the budget, where that is safe); its JSON answer.

        Raises:
            ApiError: The API's error answer.
            ConnectionLostError: No answer within the retry budget.
        """
        backoff = Backoff(self.retry)
        while True:
            failure: Exception
            try:
                response = self.http.send(self._build(request))
            except httpx.TransportError as exc:
                if not (request.idempotent or isinstance(exc, httpx.ConnectError)):
                    raise lost(exc, 1, None, started=True) from exc
                failure = exc
            else:
                if response.is_success:
                    return json_body(response.status_code, response.content)
                error = error_of_answer(response.status_code, response.headers, response.content)
                if not is_resendable(request, error):
                    raise error
                failure = error
            delay = backoff.next_delay(getattr(failure, "retry_after", None))
            if delay is None:
                raise lost(failure, backoff.failures, None) from failure
            time.sleep(delay)

    def stream(
        self, first: Request, user: str | None, *, task_id: str | None, after: str | None, continue_on_pause: bool
    ) -> EventStream:
        state = StreamState(task_id=task_id, last_event_id=after, continue_on_pause=continue_on_pause)
        return EventStream(self, state, first, user)

    def fetch_run(self, run_id: str, user: str | None) -> RunDetail:
        return RunDetail.from_json(self.call(self.routes.get_run(run_id, user)))

    def still_paused(self, state: StreamState, user: str | None) -> bool:
        """After a connection broke right after a pause: whether the run is still paused (the stream is over).

        The web app has no run endpoint: there a pause that was the last event is taken as the end.
        """
        if not self.routes.with_user or state.workflow_run_id is None:
            return True
        try:
            return self.fetch_run(state.workflow_run_id, user).status == "paused"
        except (ApiError, ConnectionLostError):
            return False

    def with_run(self, error: EventsGoneError, run_id: str | None, user: str | None) -> EventsGoneError:
        """A 410 carries the run's row; fetch it if an older server did not send it."""
        if error.run is None and self.routes.with_user and run_id is not None:
            with contextlib.suppress(ApiError, ConnectionLostError):
                error.run = self.fetch_run(run_id, user)
        return error

    def close(self) -> None:
        if self._owns_http:
            self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()


class Client(ClientCore):
    """The service API with an app's API key; every call names the end user.

    Args:
        base_url: e.g. ``http://127.0.0.1:5001``.
        api_key: the app's key (``app-…``).
        retry: the reconnect and resend budget.
        read_timeout: seconds without a byte before a connection counts as dead (the server pings
            idle streams every ``SSE_PING_INTERVAL``, 10 s by default).
        on_reconnect: called before each reconnect of a stream (e.g. to show a note).
        http_client: an ``httpx.Client`` of your own (proxies, TLS); not closed by :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        retry: RetryPolicy | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        on_reconnect: ReconnectHook | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url,
            SERVICE_ROUTES,
            retry=retry,
            read_timeout=read_timeout,
            on_reconnect=on_reconnect,
            http_client=http_client,
        )
        self.api_key = api_key

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @overload
    def run(
        self, inputs: Mapping[str, Any], user: str, *, stream: Literal[True] = True, continue_on_pause: bool = False
    ) -> EventStream: ...

    @overload
    def run(self, inputs: Mapping[str, Any], user: str, *, stream: Literal[False]) -> RunOutcome: ...

    def run(
        self, inputs: Mapping[str, Any], user: str, *, stream: bool = True, continue_on_pause: bool = False
    ) -> EventStream | RunOutcome:
        """Start a run. Streaming: its events (to ``workflow_finished``, or the pause unless
        ``continue_on_pause``). Not streaming: wait for it to finish or pause (``blocking`` mode)."""
        if not stream:
            return outcome_of(self.call(self.routes.run(inputs, user, "blocking")))
        return self.stream(
            self.routes.run(inputs, user, "streaming"),
            user,
            task_id=None,
            after=None,
            continue_on_pause=continue_on_pause,
        )

    def start(self, inputs: Mapping[str, Any], user: str) -> RunHandle:
        """Start a run in the background (``async`` mode); follow it later with :meth:`follow`."""
        body = self.call(self.routes.run(inputs, user, "async"))
        return RunHandle(task_id=str(body["task_id"]), workflow_run_id=str(body["workflow_run_id"]))

    def follow(
        self, task_id: str, user: str, *, after: str | None = None, continue_on_pause: bool = False
    ) -> EventStream:
        """(Re)attach to a run's events: strictly after the resume token ``after``, or from its beginning."""
        first = self.routes.events(task_id, user, last_event_id=after, continue_on_pause=continue_on_pause)
        return self.stream(first, user, task_id=task_id, after=after, continue_on_pause=continue_on_pause)

    def stop(self, task_id: str, user: str) -> None:
        """Stop a running or paused run (idempotent)."""
        self.call(self.routes.stop(task_id, user))

    def submit_human_input(self, run_id: str, user: str, inputs: Mapping[str, Any]) -> HumanInputAccepted:
        """Submit the form of a paused run's human-input node; the run goes on in the background."""
        body = self.call(self.routes.human_input(run_id, user, inputs))
        return HumanInputAccepted(str(body["task_id"]), str(body["workflow_run_id"]), str(body["status"]))

    def get_run(self, run_id: str, user: str) -> RunDetail:
        """The run's row (status, outputs, error, timing)."""
        return self.fetch_run(run_id, user)


class WebClient(ClientCore):
    """The web app of one site (``site_code``) as a browser sees it: a passport names the end user.

    The passport is fetched on first use; pass a saved one (:attr:`passport`) to act as the same end
    user in another process (its runs are visible to that end user only).
    """

    def __init__(
        self,
        base_url: str,
        site_code: str,
        *,
        passport: Passport | None = None,
        retry: RetryPolicy | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        on_reconnect: ReconnectHook | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        super().__init__(
            base_url,
            WEB_ROUTES,
            retry=retry,
            read_timeout=read_timeout,
            on_reconnect=on_reconnect,
            http_client=http_client,
        )
        self.site_code = site_code
        self._passport = passport

    @property
    def passport(self) -> Passport:
        """The end user's passport (fetched on first use)."""
        if self._passport is None:
            self._passport = passport_of(self.call(self.routes.passport(self.site_code)))
        return self._passport

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.passport.access_token}"}

    @overload
    def run(
        self, inputs: Mapping[str, Any], *, stream: Literal[True] = True, continue_on_pause: bool = False
    ) -> EventStream: ...

    @overload
    def run(self, inputs: Mapping[str, Any], *, stream: Literal[False]) -> RunOutcome: ...

    def run(
        self, inputs: Mapping[str, Any], *, stream: bool = True, continue_on_pause: bool = False
    ) -> EventStream | RunOutcome:
        """As :meth:`Client.run`, for the passport's end user."""
        if not stream:
            return outcome_of(self.call(self.routes.run(inputs, None, "blocking")))
        first = self.routes.run(inputs, None, "streaming")
        return self.stream(first, None, task_id=None, after=None, continue_on_pause=continue_on_pause)

    def start(self, inputs: Mapping[str, Any]) -> RunHandle:
        body = self.call(self.routes.run(inputs, None, "async"))
        return RunHandle(task_id=str(body["task_id"]), workflow_run_id=str(body["workflow_run_id"]))

    def follow(self, task_id: str, *, after: str | None = None, continue_on_pause: bool = False) -> EventStream:
        first = self.routes.events(task_id, None, last_event_id=after, continue_on_pause=continue_on_pause)
        return self.stream(first, None, task_id=task_id, after=after, continue_on_pause=continue_on_pause)

    def stop(self, task_id: str) -> None:
        self.call(self.routes.stop(task_id, None))
