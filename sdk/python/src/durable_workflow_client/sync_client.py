"""The blocking client: :class:`Client` (service API, API key) and :class:`WebClient` (web app, passport).

Both stream a run's events as an :class:`EventStream`, which reconnects by itself: see
:mod:`durable_workflow_client.sessions` for the rules (the same for both clients: this module only
sends, reads and waits) and :mod:`durable_workflow_client.retry` for the budget.
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Generator, Iterator, Mapping
from typing import Any, Literal, Self, overload

import httpx
from httpx_sse import EventSource

from .base import ClientBase, ServiceFlavour, WebFlavour
from .common import accepted_of, handle_of, outcome_of, passport_of
from .errors import ApiError, ConnectionLostError, EventsGoneError
from .events import Event
from .models import HumanInputAccepted, Passport, RunDetail, RunHandle, RunOutcome
from .protocol import Request, error_of_answer
from .sessions import RECONNECTABLE, StreamSession, StreamView


class _Closing:
    """``with`` closes it."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()


class EventStream(_Closing, StreamView, Iterator[Event]):
    """A run's events, exactly once and in order, across as many connections as it takes.

    Iterate it (or use it as a context manager and iterate). :attr:`last_event_id` is the resume
    token of the last event delivered: persist it and pass it as ``after=`` to :meth:`Client.follow`
    to continue in another process.
    """

    def __init__(self, core: ClientCore, session: StreamSession) -> None:
        super().__init__(session)
        self._core = core
        self._events: Generator[Event, None, None] | None = None

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

    def _run(self) -> Generator[Event, None, None]:
        session = self._session
        while not session.done:
            try:
                yield from self._connection(session.request)
            except EventsGoneError as exc:
                raise self._core.with_run(exc, session) from None
            except RECONNECTABLE as exc:
                if session.failed(exc) and self._core.still_paused(session):
                    session.finish()
                    return
                time.sleep(session.reconnect(exc))

    def _connection(self, request: Request) -> Generator[Event, None, None]:
        """The events of one connection; returns when the stream is over or goes on, raises when it failed."""
        session = self._session
        response = self._core.open(request)
        try:
            if response.status_code != 200:
                response.read()
                raise error_of_answer(response.status_code, response.headers, response.content)
            session.connected(response.headers)
            for sse in EventSource(response).iter_sse():
                event = session.received(sse)
                if event is not None:
                    yield event
                if session.done:
                    return
        finally:
            response.close()
        session.ended()


class ClientCore(_Closing, ClientBase[httpx.Client]):
    """What both flavours share: the HTTP client, credentials, retries and the stream plumbing."""

    def new_http(self, timeout: httpx.Timeout) -> httpx.Client:
        return httpx.Client(timeout=timeout)

    def open(self, request: Request) -> httpx.Response:
        """Send ``request`` and return the response with its body not yet read (close it)."""
        return self.http.send(self.build(request, stream=True), stream=True)

    def call(self, request: Request) -> dict[str, Any]:
        """Send ``request`` (again, within the budget, where that is safe); its JSON answer.

        Raises:
            ApiError: The API's error answer.
            ConnectionLostError: No answer within the retry budget.
        """
        call = self.new_call(request)
        while True:
            try:
                response = self.http.send(self.build(request))
            except httpx.TransportError as exc:
                step = call.failed(exc)
            else:
                step = call.answered(response.status_code, response.headers, response.content)
            if step.body is not None:
                return step.body
            time.sleep(step.delay)

    def fetch_run(self, run_id: str, user: str | None) -> RunDetail:
        return RunDetail.from_json(self.call(self.routes.get_run(run_id, user)))

    def still_paused(self, session: StreamSession) -> bool:
        """After a connection broke right after a pause: whether the run is still paused (the stream is over).

        The web app has no run endpoint: there a pause that was the last event is taken as the end.
        """
        run_id = session.run_to_fetch
        if run_id is None:
            return True
        try:
            return self.fetch_run(run_id, session.user).status == "paused"
        except (ApiError, ConnectionLostError):
            return False

    def with_run(self, error: EventsGoneError, session: StreamSession) -> EventsGoneError:
        """A 410 carries the run's row; fetch it if an older server did not send it."""
        run_id = session.run_to_fetch
        if error.run is None and run_id is not None:
            with contextlib.suppress(ApiError, ConnectionLostError):
                error.run = self.fetch_run(run_id, session.user)
        return error

    def close(self) -> None:
        if self._owns_http:
            self.http.close()


class Client(ServiceFlavour[httpx.Client], ClientCore):
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
        return EventStream(self, self.run_session(inputs, user, continue_on_pause))

    def start(self, inputs: Mapping[str, Any], user: str) -> RunHandle:
        """Start a run in the background (``async`` mode); follow it later with :meth:`follow`."""
        return handle_of(self.call(self.routes.run(inputs, user, "async")))

    def follow(
        self, task_id: str, user: str, *, after: str | None = None, continue_on_pause: bool = False
    ) -> EventStream:
        """(Re)attach to a run's events: strictly after the resume token ``after``, or from its beginning."""
        return EventStream(self, self.follow_session(task_id, user, after, continue_on_pause))

    def stop(self, task_id: str, user: str) -> None:
        """Stop a running or paused run (idempotent)."""
        self.call(self.routes.stop(task_id, user))

    def submit_human_input(self, run_id: str, user: str, inputs: Mapping[str, Any]) -> HumanInputAccepted:
        """Submit the form of a paused run's human-input node; the run goes on in the background."""
        return accepted_of(self.call(self.routes.human_input(run_id, user, inputs)))

    def get_run(self, run_id: str, user: str) -> RunDetail:
        """The run's row (status, outputs, error, timing)."""
        return self.fetch_run(run_id, user)


class WebClient(WebFlavour[httpx.Client], ClientCore):
    """The web app of one site (``site_code``) as a browser sees it: a passport names the end user.

    The passport is fetched on first use; pass a saved one (:attr:`passport`) to act as the same end
    user in another process (its runs are visible to that end user only).
    """

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
        return EventStream(self, self.run_session(inputs, None, continue_on_pause))

    def start(self, inputs: Mapping[str, Any]) -> RunHandle:
        return handle_of(self.call(self.routes.run(inputs, None, "async")))

    def follow(self, task_id: str, *, after: str | None = None, continue_on_pause: bool = False) -> EventStream:
        return EventStream(self, self.follow_session(task_id, None, after, continue_on_pause))

    def stop(self, task_id: str) -> None:
        self.call(self.routes.stop(task_id, None))
