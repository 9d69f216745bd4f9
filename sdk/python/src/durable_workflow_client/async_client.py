"""The asyncio client: :class:`AsyncClient` and :class:`AsyncWebClient`, the same surface as the blocking
:class:`~durable_workflow_client.Client` and :class:`~durable_workflow_client.WebClient` with ``await``.

Both stream a run's events as an :class:`AsyncEventStream`, which reconnects by itself: see
:mod:`durable_workflow_client.sessions` for the rules (the same for both clients: this module only
sends, reads and waits) and :mod:`durable_workflow_client.retry` for the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Mapping
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
    """``async with`` closes it."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        await self.aclose()


class AsyncEventStream(_Closing, StreamView, AsyncIterator[Event]):
    """A run's events, exactly once and in order, across as many connections as it takes.

    Iterate it (or use it as a context manager and iterate). :attr:`last_event_id` is the resume
    token of the last event delivered: persist it and pass it as ``after=`` to :meth:`AsyncClient.follow`
    to continue in another process.
    """

    def __init__(self, core: AsyncClientCore, session: StreamSession) -> None:
        super().__init__(session)
        self._core = core
        self._events: AsyncGenerator[Event, None] | None = None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        if self._events is None:
            self._events = self._run()
        return await anext(self._events)

    async def aclose(self) -> None:
        """Stop reading (closes the open connection, if any)."""
        if self._events is not None:
            await self._events.aclose()

    async def _run(self) -> AsyncGenerator[Event, None]:
        session = self._session
        while not session.done:
            try:
                async for event in self._connection(session.request):
                    yield event
            except EventsGoneError as exc:
                raise await self._core.with_run(exc, session) from None
            except RECONNECTABLE as exc:
                if session.failed(exc) and await self._core.still_paused(session):
                    session.finish()
                    return
                await asyncio.sleep(session.reconnect(exc))

    async def _connection(self, request: Request) -> AsyncGenerator[Event, None]:
        """The events of one connection; returns when the stream is over or goes on, raises when it failed."""
        session = self._session
        response = await self._core.open(request)
        try:
            if response.status_code != 200:
                await response.aread()
                raise error_of_answer(response.status_code, response.headers, response.content)
            session.connected(response.headers)
            async for sse in EventSource(response).aiter_sse():
                event = session.received(sse)
                if event is not None:
                    yield event
                if session.done:
                    return
        finally:
            await response.aclose()
        session.ended()


class AsyncClientCore(_Closing, ClientBase[httpx.AsyncClient]):
    """What both flavours share: the HTTP client, credentials, retries and the stream plumbing."""

    def new_http(self, timeout: httpx.Timeout) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout)

    async def prepare(self) -> None:
        """Obtain what :meth:`auth_headers` needs, if that takes a request."""

    async def open(self, request: Request) -> httpx.Response:
        """Send ``request`` and return the response with its body not yet read (close it)."""
        if request.authenticated:
            await self.prepare()
        return await self.http.send(self.build(request, stream=True), stream=True)

    async def exchange(self, request: Request) -> Step:
        """Send ``request`` (again, within the budget, where that is safe); the step with its answer.

        Raises:
            ApiError: The API's error answer.
            ConnectionLostError: No answer within the retry budget.
        """
        if request.authenticated:
            await self.prepare()
        call = self.new_call(request)
        while True:
            try:
                response = await self.http.send(self.build(request))
            except httpx.TransportError as exc:
                step = call.failed(exc)
            else:
                step = call.answered(response.status_code, response.headers, response.content)
            if step.body is not None:
                return step
            await asyncio.sleep(step.delay)

    async def call(self, request: Request) -> dict[str, Any]:
        """As :meth:`exchange`: the JSON answer."""
        return (await self.exchange(request)).answer

    async def _blocking(self, request: Request) -> RunOutcome:
        step = await self.exchange(request)
        return outcome_of(step.answer, step.replayed)

    async def _started(self, request: Request) -> RunHandle:
        step = await self.exchange(request)
        return handle_of(step.answer, step.replayed)

    async def get_form(self, form_token: str) -> HumanInputForm:
        """The human-input form of ``form_token`` (from ``human_input_required`` or a pause's reasons)."""
        return HumanInputForm.from_json(await self.call(self.routes.form(form_token)))

    async def _submit_form(
        self, form_token: str, user: str | None, inputs: Mapping[str, Any], action: str | None
    ) -> None:
        chosen = action if action is not None else first_action(await self.get_form(form_token))
        await self.call(self.routes.submit_form(form_token, user, inputs, chosen))

    async def fetch_run(self, run_id: str, user: str | None) -> RunDetail:
        return RunDetail.from_json(await self.call(self.routes.get_run(run_id, user)))

    async def still_paused(self, session: StreamSession) -> bool:
        """After a connection broke right after a pause: whether the run is still paused (the stream is over).

        The web app has no run endpoint: there a pause that was the last event is taken as the end.
        """
        run_id = session.run_to_fetch
        if run_id is None:
            return True
        try:
            return (await self.fetch_run(run_id, session.user)).status == "paused"
        except (ApiError, ConnectionLostError):
            return False

    async def with_run(self, error: EventsGoneError, session: StreamSession) -> EventsGoneError:
        """A 410 carries the run's row; fetch it if an older server did not send it."""
        run_id = session.run_to_fetch
        if error.run is None and run_id is not None:
            with contextlib.suppress(ApiError, ConnectionLostError):
                error.run = await self.fetch_run(run_id, session.user)
        return error

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()


class AsyncClient(ServiceFlavour[httpx.AsyncClient], AsyncClientCore):
    """The service API with an app's API key; every call names the end user.

    Args:
        base_url: e.g. ``http://127.0.0.1:5001``.
        api_key: the app's key (``app-…``).
        retry: the reconnect and resend budget.
        read_timeout: seconds without a byte before a connection counts as dead (the server pings
            idle streams every ``SSE_PING_INTERVAL``, 10 s by default).
        on_reconnect: called before each reconnect of a stream (e.g. to show a note).
        http_client: an ``httpx.AsyncClient`` of your own (proxies, TLS); not closed by :meth:`aclose`.
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
    ) -> AsyncEventStream: ...

    @overload
    def run(
        self, inputs: Mapping[str, Any], user: str, *, stream: Literal[False], idempotency_key: IdempotencyKey = None
    ) -> Coroutine[Any, Any, RunOutcome]: ...

    def run(
        self,
        inputs: Mapping[str, Any],
        user: str,
        *,
        stream: bool = True,
        continue_on_pause: bool = False,
        idempotency_key: IdempotencyKey = None,
    ) -> AsyncEventStream | Coroutine[Any, Any, RunOutcome]:
        """Start a run. Streaming: its events (``async for``; to ``workflow_finished``, or the pause
        unless ``continue_on_pause``). Not streaming: a coroutine that waits for it to finish or pause
        (``blocking`` mode). ``idempotency_key`` as for :meth:`Client.run`."""
        if not stream:
            return self._blocking(self.run_request(inputs, user, "blocking", idempotency_key))
        return AsyncEventStream(self, self.run_session(inputs, user, continue_on_pause, idempotency_key))

    async def start(self, inputs: Mapping[str, Any], user: str, *, idempotency_key: IdempotencyKey = None) -> RunHandle:
        """Start a run in the background (``async`` mode); follow it later with :meth:`follow`."""
        return await self._started(self.run_request(inputs, user, "async", idempotency_key))

    def follow(
        self,
        run_id: str,
        user: str,
        *,
        after: str | None = None,
        continue_on_pause: bool = False,
        from_start: bool = True,
    ) -> AsyncEventStream:
        """(Re)attach to a run's events, as :meth:`Client.follow`."""
        return AsyncEventStream(self, self.follow_session(run_id, user, after, continue_on_pause, from_start))

    async def stop(self, task_id: str, user: str) -> None:
        """Stop a running or paused run (idempotent)."""
        await self.call(self.routes.stop(task_id, user))

    async def submit_form(
        self, form_token: str, user: str, inputs: Mapping[str, Any], action: str | None = None
    ) -> None:
        """Submit a human-input form, as :meth:`Client.submit_form`."""
        await self._submit_form(form_token, user, inputs, action)

    async def submit_human_input(
        self, run_id: str, user: str, inputs: Mapping[str, Any], *, action: str | None = None
    ) -> HumanInputAccepted:
        """Submit the open form of a paused run by the run's id, as :meth:`Client.submit_human_input`."""
        return accepted_of(await self.call(self.routes.human_input(run_id, user, inputs, action)))

    async def get_run(self, run_id: str, user: str) -> RunDetail:
        """The run's row (status, outputs, error, timing)."""
        return await self.fetch_run(run_id, user)


class AsyncWebClient(WebFlavour[httpx.AsyncClient], AsyncClientCore):
    """The web app of one site (``site_code``) as a browser sees it: a passport names the end user.

    The passport is fetched on first use; pass a saved one (:meth:`get_passport`) to act as the same end
    user in another process (its runs are visible to that end user only).
    """

    async def get_passport(self) -> Passport:
        """The end user's passport (fetched on first use)."""
        if self._passport is None:
            self._passport = passport_of(await self.call(self.routes.passport(self.site_code)))
        return self._passport

    async def prepare(self) -> None:
        await self.get_passport()

    def auth_headers(self) -> dict[str, str]:
        assert self._passport is not None, "prepare() obtains the passport before any request needs it"
        return {"Authorization": f"Bearer {self._passport.access_token}"}

    @overload
    def run(
        self,
        inputs: Mapping[str, Any],
        *,
        stream: Literal[True] = True,
        continue_on_pause: bool = False,
        idempotency_key: IdempotencyKey = None,
    ) -> AsyncEventStream: ...

    @overload
    def run(
        self, inputs: Mapping[str, Any], *, stream: Literal[False], idempotency_key: IdempotencyKey = None
    ) -> Coroutine[Any, Any, RunOutcome]: ...

    def run(
        self,
        inputs: Mapping[str, Any],
        *,
        stream: bool = True,
        continue_on_pause: bool = False,
        idempotency_key: IdempotencyKey = None,
    ) -> AsyncEventStream | Coroutine[Any, Any, RunOutcome]:
        """As :meth:`AsyncClient.run`, for the passport's end user."""
        if not stream:
            return self._blocking(self.run_request(inputs, None, "blocking", idempotency_key))
        return AsyncEventStream(self, self.run_session(inputs, None, continue_on_pause, idempotency_key))

    async def start(self, inputs: Mapping[str, Any], *, idempotency_key: IdempotencyKey = None) -> RunHandle:
        return await self._started(self.run_request(inputs, None, "async", idempotency_key))

    def follow(
        self, run_id: str, *, after: str | None = None, continue_on_pause: bool = False, from_start: bool = True
    ) -> AsyncEventStream:
        return AsyncEventStream(self, self.follow_session(run_id, None, after, continue_on_pause, from_start))

    async def stop(self, task_id: str) -> None:
        await self.call(self.routes.stop(task_id, None))

    async def submit_form(self, form_token: str, inputs: Mapping[str, Any], action: str | None = None) -> None:
        """As :meth:`AsyncClient.submit_form`, for the passport's end user."""
        await self._submit_form(form_token, None, inputs, action)
