"""An SSE client that follows one run to its end the way a browser would, over real HTTP.

It starts a streaming run (with an ``Idempotency-Key``, so a POST that got no answer is sent again
without starting a second run), learns the run's ids from the answer's headers, drops its connection
on purpose after chosen numbers of events (or loses it to a fault), and reconnects with
``Last-Event-ID`` to a randomly chosen server until it has read ``workflow_finished``, got a 410, or
run out of time. A reconnect before any event asks for the run from its beginning
(``include_state_snapshot``): without a position the server would start at the run's tail. Every
connection is recorded as a :class:`Connection`, so a caller can check each resumed stream against
the stored run.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import requests

from harness.sse import SseMessage, parse_sse

#: (connect, read) timeouts; the server pings idle streams, so a long read timeout means a hang.
TIMEOUTS = (10.0, 60.0)
RETRY_PAUSE = 0.2


@dataclasses.dataclass
class Received:
    id: str | None
    event: dict[str, Any]
    at: float  # time.monotonic() when it arrived


@dataclasses.dataclass
class Connection:
    url: str
    #: The ``Last-Event-ID`` sent (``None`` for the streaming POST and for reconnects before any event
    #: with an id).
    last_event_id: str | None
    #: The event that id belonged to, as this client received it.
    anchor: dict[str, Any] | None
    status: int | None = None
    events: list[Received] = dataclasses.field(default_factory=list)
    #: An error body: the JSON of a non-200 answer, or of an ``event: error`` message.
    error: dict[str, Any] | None = None
    #: finished | dropped (on purpose) | broken (transport error) | eof (closed without an end)
    #: | error (``event: error``) | http (a non-200 answer) | refused (no answer)
    ended: str = ""

    @property
    def resumed(self) -> bool:
        return self.last_event_id is not None


@dataclasses.dataclass
class FollowedRun:
    task_id: str | None = None
    run_id: str | None = None
    connections: list[Connection] = dataclasses.field(default_factory=list)
    #: The 410 code that stopped the client, if one did.
    gone: str | None = None
    finished_at: float | None = None
    failure: str | None = None

    @property
    def received(self) -> list[dict[str, Any]]:
        return [item.event for connection in self.connections for item in connection.events]

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def reconnects(self) -> int:
        return max(0, len(self.connections) - 1)

    def statuses(self) -> list[int]:
        return [c.status for c in self.connections if c.status is not None]


class Follower:
    """Follows one run; ``cuts`` are the numbers of events received after which to drop on purpose."""

    def __init__(
        self,
        urls: Sequence[str],
        key: str,
        *,
        rng: random.Random,
        cuts: Sequence[int] = (),
        inputs: dict[str, Any] | None = None,
        user: str = "u1",
        deadline: float = 120.0,
        on_event: Callable[[FollowedRun, Received], None] | None = None,
        progress: Callable[[dict[str, Any]], int] | None = None,
    ) -> None:
        self.urls = list(urls)
        self.key = key
        self.rng = rng
        self.cuts = sorted(cuts)
        self.inputs = inputs or {"name": "soak"}
        self.user = user
        self.deadline = time.monotonic() + deadline
        self.on_event = on_event
        #: How far into the run an event is, for the cuts; by default how many events this client read.
        #: A live-only client misses events, so it measures by the event's place in a whole run.
        self.progress = progress
        self.run = FollowedRun()
        #: Sent with every attempt of the run's POST: the server starts one run for all of them.
        self.idempotency_key = str(uuid.uuid4())
        self._last: Received | None = None
        self._count = 0

    def follow(self) -> FollowedRun:
        """Start the run and follow it to its end; never raises for what the server does."""
        try:
            self._follow()
        except Exception as exc:  # an unexpected client-side failure is a result too
            self.run.failure = f"{type(exc).__name__}: {exc}"
        return self.run

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "Connection": "close"}

    def _follow(self) -> None:
        started = self._start()
        if started is None:
            return
        connection, response = started
        self.run.task_id = response.headers.get("X-Task-Id")
        self.run.run_id = response.headers.get("X-Workflow-Run-Id")
        self._read(connection, response)
        while not self._done():
            if time.monotonic() >= self.deadline:
                self.run.failure = "the client gave up: deadline passed"
                return
            if self.run.task_id is None and self.run.run_id is None:
                self.run.failure = "the streaming answer named no run"
                return
            if connection.ended not in ("dropped",):
                time.sleep(RETRY_PAUSE)  # the server or the store is away: do not hammer it
            connection = self._reconnect()

    def _start(self) -> tuple[Connection, requests.Response] | None:
        """The run's streaming POST, sent again with the same key until one is answered (or the deadline)."""
        body: dict[str, Any] = {"inputs": self.inputs, "user": self.user, "response_mode": "streaming"}
        headers = {**self._headers(), "Idempotency-Key": self.idempotency_key}
        while True:
            url = self.rng.choice(self.urls)
            connection = Connection(url, None, None)
            self.run.connections.append(connection)
            try:
                response = requests.post(
                    f"{url}/v1/workflows/run", json=body, headers=headers, stream=True, timeout=TIMEOUTS
                )
            except requests.RequestException as exc:
                connection.ended = "refused"
                if time.monotonic() >= self.deadline:
                    self.run.failure = f"the run could not be started: {exc}"
                    return None
                time.sleep(RETRY_PAUSE)
                continue
            return connection, response

    def _done(self) -> bool:
        return self.run.finished or self.run.gone is not None or self.run.failure is not None

    def _reconnect(self) -> Connection:
        url = self.rng.choice(self.urls)
        last = self._last
        connection = Connection(url, last.id if last else None, last.event if last else None)
        self.run.connections.append(connection)
        headers = self._headers()
        if last is not None and last.id is not None:
            headers["Last-Event-ID"] = last.id
        # Before any event the run is asked for from its beginning; after events without ids (a
        # live-only transport) there is nothing to resume, and the client starts afresh.
        query = f"user={self.user}" + ("&include_state_snapshot=true" if self._count == 0 else "")
        try:
            response = requests.get(
                f"{url}/v1/workflow/{self.run.run_id or self.run.task_id}/events?{query}",
                headers=headers,
                stream=True,
                timeout=TIMEOUTS,
            )
        except requests.RequestException:
            connection.ended = "refused"
            return connection
        self._read(connection, response)
        return connection

    def _read(self, connection: Connection, response: requests.Response) -> None:
        connection.status = response.status_code
        try:
            if response.status_code != 200:
                connection.ended = "http"
                connection.error = _json_or_text(response.content)
                if response.status_code == 410:
                    self.run.gone = str(connection.error.get("code"))
                return
            connection.ended = self._consume(connection, _messages(response))
        except requests.RequestException:
            connection.ended = "broken"
        finally:
            response.close()

    def _consume(self, connection: Connection, messages: Iterator[SseMessage]) -> str:
        if self._count == 0 and self._cut_now(0):
            return "dropped"  # before any event: only the response's headers named the run
        for message in messages:
            if message.event == "error":
                connection.error = _json_or_text(message.data.encode())
                if connection.error.get("status") == 410:
                    self.run.gone = str(connection.error.get("code"))
                return "error"
            if message.event is not None:  # ping
                continue
            item = Received(message.id, message.json, time.monotonic())
            connection.events.append(item)
            self._count += 1
            if item.id is not None:  # live-only transports send none: their reconnects start afresh
                self._last = item
            if self.on_event is not None:
                self.on_event(self.run, item)
            if item.event.get("event") == "workflow_finished":
                self.run.finished_at = item.at
                return "finished"
            if self._cut_now(self.progress(item.event) + 1 if self.progress else self._count):
                return "dropped"
        return "eof"

    def _cut_now(self, reached: int) -> bool:
        if self.cuts and reached >= self.cuts[0]:
            while self.cuts and reached >= self.cuts[0]:
                self.cuts.pop(0)
            return True
        return False


def _messages(response: requests.Response) -> Iterator[SseMessage]:
    return parse_sse(response.iter_content(chunk_size=None))


def _json_or_text(content: bytes) -> dict[str, Any]:
    try:
        value = json.loads(content)
    except ValueError:
        return {"text": content.decode(errors="replace")[:500]}
    return value if isinstance(value, dict) else {"value": value}


def random_cuts(rng: random.Random, count: int, expected_events: int) -> list[int]:
    """``count`` distinct drop points in ``[0, expected_events)``; 0 drops before the first event."""
    return sorted(rng.sample(range(expected_events), min(count, expected_events)))


def read_run(
    url: str,
    key: str,
    run_id: str,
    *,
    user: str = "u1",
    last_event_id: str | None = None,
    include_state_snapshot: bool | None = None,
) -> Connection:
    """One reconnect to a run's events (``run_id``: its workflow run id or its task id), read to its end
    (or until the server ends the response).

    ``include_state_snapshot`` defaults to reading the run from its beginning when no
    ``last_event_id`` is given (the server's own default is the run's tail).
    """
    connection = Connection(url, last_event_id, None)
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    snapshot = last_event_id is None if include_state_snapshot is None else include_state_snapshot
    query = f"user={user}" + ("&include_state_snapshot=true" if snapshot else "")
    try:
        response = requests.get(
            f"{url}/v1/workflow/{run_id}/events?{query}", headers=headers, stream=True, timeout=TIMEOUTS
        )
    except requests.RequestException:
        connection.ended = "refused"
        return connection
    follower = Follower([url], key, rng=random.Random(0), user=user)
    follower._read(connection, response)
    return connection
