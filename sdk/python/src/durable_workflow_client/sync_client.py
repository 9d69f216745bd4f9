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

from .base import ClientBase, ServiceFlavour, WebFlavour, first_action
from .common import accepted_of, handle_of, outcome_of, passport_of
from .errors import ApiError, ConnectionLostError, EventsGoneError
from .events import Event
from .forms import HumanInputForm
from .models import HumanInputAccepted, Passport, RunDetail, RunHandle, RunOutcome
from .protocol import IdempotencyKey, Request, error_of_answer
from .sessions import RECONNECTABLE, Step, StreamSession, StreamView


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

    def exchange(self, request: Request) -> Step:
        """Send ``request`` (again, within the budget, where that is safe); the step with its answer.

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
                return step
            time.sleep(step.delay)

    def call(self, request: Request) -> dict[str, Any]:
        """As :meth:`exchange`: the JSON answer."""
        return self.exchange(request).answer

    def get_form(self, form_token: str) -> HumanInputForm:
        """The human-input form of ``form_token`` (from ``human_input_required`` or a pause's reasons)."""
        return HumanInputForm.from_json(self.call(self.routes.form(form_token)))

    def _submit_form(self, form_token: str, user: str | None, inputs: Mapping[str, Any], action: str | None) -> None:
        chosen = action if action is not None else first_action(self.get_form(form_token))
        self.call(self.routes.submit_form(form_token, user, inputs, chosen))

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
        self,
        inputs: Mapping[str, Any],
        user: str,
        *,
        stream: Literal[True] = True,
        continue_on_pause: bool = False,
        idempotency_key: IdempotencyKey = None,
    ) -> EventStream: ...

    @overload
    def run(
        self, inputs: Mapping[str, Any], user: str, *, stream: Literal[False], idempotency_key: IdempotencyKey = None
    ) -> RunOutcome: ...

    def run(
        self,
        inputs: Mapping[str, Any],
        user: str,
        *,
        stream: bool = True,
        continue_on_pause: bool = False,
        idempotency_key: IdempotencyKey = None,
    ) -> EventStream | RunOutcome:
        """Start a run. Streaming: its events (to ``workflow_finished``, or the pause unless
        ``continue_on_pause``). Not streaming: wait for it to finish or pause (``blocking`` mode).

        ``idempotency_key``: ``None`` sends a fresh random ``Idempotency-Key``, so that a POST cut
        before its answer is sent again without starting a second run; a string of your own does
        the same across processes; ``False`` sends none.
        """
        if not stream:
            step = self.exchange(self.run_request(inputs, user, "blocking", idempotency_key))
            return outcome_of(step.answer, step.replayed)
        return EventStream(self, self.run_session(inputs, user, continue_on_pause, idempotency_key))

    def start(self, inputs: Mapping[str, Any], user: str, *, idempotency_key: IdempotencyKey = None) -> RunHandle:
        """Start a run in the background (``async`` mode); follow it later with :meth:`follow`."""
        step = self.exchange(self.run_request(inputs, user, "async", idempotency_key))
        return handle_of(step.answer, step.replayed)

    def follow(
        self,
        run_id: str,
        user: str,
        *,
        after: str | None = None,
        continue_on_pause: bool = False,
        from_start: bool = True,
    ) -> EventStream:
        """(Re)attach to a run's events (``run_id``: its workflow run id, or its task id): strictly
        after the resume token ``after``; without one, from the run's beginning, or with
        ``from_start=False`` from what happens next (a finished run: its ``workflow_finished``)."""
        return EventStream(self, self.follow_session(run_id, user, after, continue_on_pause, from_start))

    def stop(self, task_id: str, user: str) -> None:
        """Stop a running or paused run (idempotent)."""
        self.call(self.routes.stop(task_id, user))

    def submit_form(self, form_token: str, user: str, inputs: Mapping[str, Any], action: str | None = None) -> None:
        """Submit a human-input form; the run goes on in the background. Without ``action`` the
        form's first action is used (that takes a :meth:`get_form` first)."""
        self._submit_form(form_token, user, inputs, action)

    def submit_human_input(
        self, run_id: str, user: str, inputs: Mapping[str, Any], *, action: str | None = None
    ) -> HumanInputAccepted:
        """Submit the open form of a paused run by the run's id (this API's own route, kept for
        compatibility; :meth:`submit_form` is Dify's)."""
        return accepted_of(self.call(self.routes.human_input(run_id, user, inputs, action)))

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
        self,
        inputs: Mapping[str, Any],
        *,
        stream: Literal[True] = True,
        continue_on_pause: bool = False,
        idempotency_key: IdempotencyKey = None,
    ) -> EventStream: ...

    @overload
    def run(
        self, inputs: Mapping[str, Any], *, stream: Literal[False], idempotency_key: IdempotencyKey = None
    ) -> RunOutcome: ...

    def run(
        self,
        inputs: Mapping[str, Any],
        *,
        stream: bool = True,
        continue_on_pause: bool = False,
        idempotency_key: IdempotencyKey = None,
    ) -> EventStream | RunOutcome:
        """As :meth:`Client.run`, for the passport's end user."""
        if not stream:
            step = self.exchange(self.run_request(inputs, None, "blocking", idempotency_key))
            return outcome_of(step.answer, step.replayed)
        return EventStream(self, self.run_session(inputs, None, continue_on_pause, idempotency_key))

    def start(self, inputs: Mapping[str, Any], *, idempotency_key: IdempotencyKey = None) -> RunHandle:
        step = self.exchange(self.run_request(inputs, None, "async", idempotency_key))
        return handle_of(step.answer, step.replayed)

    def follow(
        self, run_id: str, *, after: str | None = None, continue_on_pause: bool = False, from_start: bool = True
    ) -> EventStream:
        return EventStream(self, self.follow_session(run_id, None, after, continue_on_pause, from_start))

    def stop(self, task_id: str) -> None:
        self.call(self.routes.stop(task_id, None))

    def submit_form(self, form_token: str, inputs: Mapping[str, Any], action: str | None = None) -> None:
        """As :meth:`Client.submit_form`, for the passport's end user."""
        self._submit_form(form_token, None, inputs, action)
