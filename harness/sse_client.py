"""An SSE client that follows one run to its end the way a browser would, over real HTTP.

It starts a streaming run, drops its connection on purpose after chosen numbers of events (or loses
it to a fault), and reconnects with ``Last-Event-ID`` to a randomly chosen server until it has read
``workflow_finished``, got a 410, or run out of time. Every connection is recorded as a
:class:`Connection`, so a caller can check each resumed stream against the stored run.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
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
    #: The ``Last-Event-ID`` sent (``None`` for the streaming POST and for reconnects before any event).
    last_event_id: str | None
    #: The event that id belonged to, as this client received it.
    anchor: dict[str, Any] | None
    status: int | None = None
    events: list[Received] = dataclasses.field(default_factory=list)
    #: An error body: the JSON of a non-200 answer, or of an ``event: error`` message.
    error: dict[str, Any] | None = None
    #: finished | dropped (on purpose) | broken (transport error) | eof (closed without an end)
    #: | error (``event: error``) | http (a non-200 answer) | refused (no connection)
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
        url = self.rng.choice(self.urls)
        connection = Connection(url, None, None)
        self.run.connections.append(connection)
        body: dict[str, Any] = {"inputs": self.inputs, "user": self.user, "response_mode": "streaming"}
        try:
            response = requests.post(
                f"{url}/v1/workflows/run", json=body, headers=self._headers(), stream=True, timeout=TIMEOUTS
            )
        except requests.RequestException as exc:
            connection.ended = "refused"
            self.run.failure = f"the run could not be started: {exc}"
            return
        self.run.task_id = response.headers.get("X-Task-Id")
        self.run.run_id = response.headers.get("X-Workflow-Run-Id")
        self._read(connection, response)
        while not self._done():
            if time.monotonic() >= self.deadline:
                self.run.failure = "the client gave up: deadline passed"
                return
            if self.run.task_id is None:
                self.run.failure = "the streaming answer named no run"
                return
            if connection.ended not in ("dropped",):
                time.sleep(RETRY_PAUSE)  # the server or the store is away: do not hammer it
            connection = self._reconnect()

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
        try:
            response = requests.get(
                f"{url}/v1/workflow/{self.run.task_id}/events?user={self.user}",
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
        for message in messages:
            if message.event == "run_created":
                self.run.task_id = message.json["task_id"]
                self.run.run_id = message.json["workflow_run_id"]
                if self._cut_now(0):
                    return "dropped"
                continue
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


def read_run(url: str, key: str, task_id: str, *, user: str = "u1", last_event_id: str | None = None) -> Connection:
    """One reconnect to a run's events, read to its end (or until the server ends the response)."""
    connection = Connection(url, last_event_id, None)
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    try:
        response = requests.get(
            f"{url}/v1/workflow/{task_id}/events?user={user}", headers=headers, stream=True, timeout=TIMEOUTS
        )
    except requests.RequestException:
        connection.ended = "refused"
        return connection
    follower = Follower([url], key, rng=random.Random(0), user=user)
    follower._read(connection, response)
    return connection
