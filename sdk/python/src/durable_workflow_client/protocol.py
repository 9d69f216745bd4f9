"""The API without I/O: the requests of each flavour, error answers, and the state of one event stream.

The sync and asyncio clients share everything here and differ only in how they send a request and
wait; so the rules of resuming (which ``Last-Event-ID``, when a stream is over, what an ``event:
error`` means) are written once.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote

from httpx_sse import ServerSentEvent

from .errors import ApiError, ProtocolError, api_error
from .events import Event, parse_event

USER_AGENT = "durable-workflow-client/0.1"
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: What a caller passes for a run's ``Idempotency-Key``: ``None`` for a fresh random one, a key of its
#: own, or ``False`` to send none.
IdempotencyKey = str | Literal[False] | None


def idempotency_key(choice: IdempotencyKey) -> str | None:
    """The key a run's POST carries, if any.

    Raises:
        ValueError: A key the server would refuse (it takes 1 to 255 visible ASCII characters).
    """
    if choice is False:
        return None
    if choice is None:
        return str(uuid.uuid4())
    if not 1 <= len(choice) <= 255 or not all("!" <= c <= "~" for c in choice):
        raise ValueError("an Idempotency-Key is 1 to 255 visible ASCII characters")
    return choice


def was_replayed(headers: Mapping[str, str]) -> bool:
    """Whether the server answered for a run an earlier request with the same key started."""
    return headers.get("idempotent-replayed", "").strip().lower() == "true"


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request, without its credentials (the client adds those)."""

    method: str
    path: str
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Whether sending it twice does no harm (then any failure may be retried, not only a refused connect).
    idempotent: bool = False
    #: Whether a 503 may be answered by sending it again: the server did nothing for a request it
    #: refused with 503 (a streaming or blocking run that could not be started was never dispatched).
    resend_on_503: bool = False
    #: Whether the request carries the client's credentials (not the one that obtains them).
    authenticated: bool = True


def _segment(value: str) -> str:
    # An id is one path segment whatever it contains: the server answers 404 rather than another route.
    return quote(value, safe="")


@dataclasses.dataclass(frozen=True, slots=True)
class Routes:
    """The requests of one flavour: the service API (``/v1``, API key, ``user`` per call) or the
    web app (``/api``, passport, the end user bound to it)."""

    prefix: str
    #: Whether requests name the end user (the web app's passport does that instead).
    with_user: bool

    def _user_params(self, user: str | None) -> dict[str, str]:
        return {"user": user} if self.with_user and user is not None else {}

    def _user_body(self, user: str | None) -> dict[str, Any]:
        return {"user": user} if self.with_user and user is not None else {}

    def run(self, inputs: Mapping[str, Any], user: str | None, mode: str, key: str | None) -> Request:
        """A run's POST; with an ``Idempotency-Key`` sending it again returns the same run, so any
        failure may be answered by sending it again."""
        body = {"inputs": dict(inputs), **self._user_body(user), "response_mode": mode}
        headers = {IDEMPOTENCY_HEADER: key} if key is not None else {}
        path = f"{self.prefix}/workflows/run"
        return Request("POST", path, json=body, headers=headers, idempotent=key is not None, resend_on_503=True)

    def events(
        self,
        run_id: str,
        user: str | None,
        *,
        last_event_id: str | None,
        continue_on_pause: bool,
        from_start: bool,
    ) -> Request:
        """A run's events: strictly after ``last_event_id``; without one, from the run's beginning
        (``from_start``) or from what happens next (the server's default)."""
        params = self._user_params(user)
        if continue_on_pause:
            params["continue_on_pause"] = "true"
        if from_start and not last_event_id:
            params["include_state_snapshot"] = "true"
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        path = f"{self.prefix}/workflow/{_segment(run_id)}/events"
        return Request("GET", path, params, headers=headers, idempotent=True, resend_on_503=True)

    def get_run(self, run_id: str, user: str | None) -> Request:
        path = f"{self.prefix}/workflows/run/{_segment(run_id)}"
        return Request("GET", path, self._user_params(user), idempotent=True, resend_on_503=True)

    def stop(self, task_id: str, user: str | None) -> Request:
        # Stopping is idempotent on the server: stopping a stopped or finished run succeeds.
        path = f"{self.prefix}/workflows/tasks/{_segment(task_id)}/stop"
        return Request("POST", path, json=self._user_body(user), idempotent=True, resend_on_503=True)

    def human_input(
        self, run_id: str, user: str | None, inputs: Mapping[str, Any], action: str | None = None
    ) -> Request:
        body: dict[str, Any] = {**self._user_body(user), "inputs": dict(inputs)}
        if action is not None:
            body["action"] = action
        return Request("POST", f"{self.prefix}/workflows/runs/{_segment(run_id)}/human-input", json=body)

    def form(self, form_token: str) -> Request:
        path = f"{self.prefix}/form/human_input/{_segment(form_token)}"
        return Request("GET", path, idempotent=True, resend_on_503=True)

    def submit_form(self, form_token: str, user: str | None, inputs: Mapping[str, Any], action: str) -> Request:
        # Not sent again once it may have arrived: a second submission would be refused as already
        # submitted (412) whether the first was this one or someone else's.
        body = {"inputs": dict(inputs), "action": action, **self._user_body(user)}
        return Request("POST", f"{self.prefix}/form/human_input/{_segment(form_token)}", json=body)

    def passport(self, site_code: str) -> Request:
        path = f"{self.prefix}/passport"
        headers = {"X-App-Code": site_code}
        return Request("GET", path, headers=headers, idempotent=True, resend_on_503=True, authenticated=False)


SERVICE_ROUTES = Routes("/v1", with_user=True)
WEB_ROUTES = Routes("/api", with_user=False)


def retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_of_answer(status: int, headers: Mapping[str, str], content: bytes) -> ApiError:
    """The error a non-2xx answer stands for; a body that is not JSON (a proxy's page) still maps by status."""
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        text = content[:200].decode("utf-8", "replace").strip()
        body = {"message": text} if text else {}
    return api_error(status, body, retry_after=retry_after(headers.get("retry-after")))


def json_body(status: int, content: bytes) -> dict[str, Any]:
    """A 2xx answer's JSON object."""
    try:
        body = json.loads(content)
    except ValueError as exc:
        raise ProtocolError(f"the server answered {status} with a body that is not JSON") from exc
    if not isinstance(body, dict):
        raise ProtocolError(f"the server answered {status} with JSON that is not an object")
    return body


class StreamState:
    """Where one logical event stream is: the run's ids, the last resume token, and whether it is over.

    Fed the messages of every connection in turn; the caller of the stream sees only the events.
    """

    def __init__(
        self, *, followed: str | None, last_event_id: str | None, continue_on_pause: bool, from_start: bool
    ) -> None:
        #: The id a stream that follows a run was given (a workflow run id or a task id).
        self.followed = followed
        self.task_id: str | None = None
        self.workflow_run_id: str | None = None
        #: The ``id:`` of the last event delivered: a reconnect sends it as ``Last-Event-ID``.
        self.last_event_id = last_event_id
        self.continue_on_pause = continue_on_pause
        #: Without a ``Last-Event-ID``, (re)connect to the run's beginning rather than its tail.
        self.from_start = from_start
        #: The stream is over (``workflow_finished``, or a pause that ended the response).
        self.done = False
        #: The last event delivered was a ``workflow_paused`` (it ends the stream if nothing follows it).
        self.after_pause = False
        #: The server's reconnection time (``retry:``), in seconds.
        self.server_retry: float | None = None
        #: Messages (events or pings) received on the current connection.
        self.received = 0
        #: The run's POST was answered for a run an earlier POST with the same key started.
        self.replayed = False

    @property
    def path_id(self) -> str | None:
        """The id a reconnect names the run by: its workflow run id (Dify's), else whichever is known."""
        return self.workflow_run_id or self.task_id or self.followed

    def on_connected(self, headers: Mapping[str, str]) -> None:
        # A run's POST names the run in its headers, before any event: a client cut before the first
        # event can still reconnect.
        self.received = 0
        self.task_id = self.task_id or headers.get("x-task-id") or None
        self.workflow_run_id = self.workflow_run_id or headers.get("x-workflow-run-id") or None
        self.replayed = self.replayed or was_replayed(headers)

    def on_message(self, sse: ServerSentEvent) -> Event | None:
        """The event this message delivers, if it is one of the run's.

        Raises:
            ApiError: An ``event: error`` (e.g. 410 when retention passes the stream mid-response,
                503 when the stream store became unavailable).
            ProtocolError: An event whose data is not a JSON object.
        """
        self.received += 1
        if sse.retry is not None:
            self.server_retry = sse.retry / 1000
        if sse.event == "ping":
            return None
        if sse.event == "error":
            raise api_error(int(_notice(sse).get("status") or 500), _notice(sse))
        if sse.event != "message":
            return None  # a notice (an older server's ``run_created``, a newer one's): not the run's
        try:
            raw = json.loads(sse.data)
        except ValueError as exc:
            raise ProtocolError(f"an event's data is not JSON: {sse.data[:200]!r}") from exc
        if not isinstance(raw, dict):
            raise ProtocolError(f"an event's data is not a JSON object: {sse.data[:200]!r}")
        event_id = sse.id or None
        if event_id is not None:
            self.last_event_id = event_id
        event = parse_event(raw, event_id)
        self.task_id = self.task_id or event.task_id or None
        self.workflow_run_id = self.workflow_run_id or event.workflow_run_id or None
        self.after_pause = event.event == "workflow_paused"
        if event.event == "workflow_finished":
            self.done = True
        return event

    def on_response_end(self) -> bool:
        """The response ended cleanly; whether the stream goes on with a reconnect that is no failure.

        A pause ends the response; it ends the stream too unless the caller asked to continue on
        pause (a streaming ``run`` always stops at a pause on the server, so it then goes on here).
        """
        if self.after_pause:
            if not self.continue_on_pause:
                self.done = True
                return False
            return True
        return False


def _notice(sse: ServerSentEvent) -> dict[str, Any]:
    try:
        body = json.loads(sse.data) if sse.data else {}
    except ValueError:
        body = {}
    return body if isinstance(body, dict) else {}
