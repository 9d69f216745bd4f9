"""One writer per topic and API process for the clients that follow a run live.

A stream without it is a WSGI generator per client: every event wakes each client's greenlet, goes
through that client's subscription and generators, is framed and sealed for it, and is written by
the server's loop. Thousands of clients of a few runs repeat the same work thousands of times
(``docs/benchmarks.md``, "SSE capacity"). Here a client reads on its own only until it is level
with the topic's writer; then it *joins* the writer and its greenlet parks. The writer holds the
one subscription of the topic in this process, frames and seals each event once (every client of a
topic is bound to the same run and user, so the token is theirs too) and writes the same bytes to
every joined client's socket without waiting for any of them. It pings them, ends them at their
terminal event or idle timeout, and hands the watcher's final event to them. The responses it ends
are closed when the worker has nothing else to do (``endings``): a run's end must not hold up
the events of the others.

Nothing is lost or repeated on the way in or out:

- A client joins only at a position the writer can continue exactly: the writer's own position,
  or one of the last :data:`RING` events it delivered (it sends the client what came after first).
  A client that is behind or ahead reads on and tries again after its next event.
- A client the writer cannot serve at once (its socket buffer is full, or the writer's
  subscription failed) is handed back to its own greenlet with its position and the unsent rest
  of its last write: the greenlet finishes that write, then reads on its own from that position
  (and joins again when level). So a slow client never holds up the others, and a store failure
  reaches every client exactly as it would without the writer.

It is used for gunicorn's gevent workers only (``SSE_SHARED_WRITER``), where the client's socket is
in the environ and every greenlet runs on one thread: the writer's state needs no lock, because
nothing here waits between reading and changing it. The writer writes whole HTTP chunks itself
(HTTP/1.1) or the bare bytes (HTTP/1.0), as gunicorn would; gunicorn's access log counts only the
bytes it wrote itself.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from flask import Flask

from api.core.app.apps.event_codec import encode_event, event_name
from api.core.app.apps.event_transport import StreamMessage, WorkflowEventTransport
from api.core.app.apps.message_generator import (
    EventBatch,
    MessageGenerator,
    StreamEvent,
    StreamItem,
    terminal_events,
)
from api.core.app.apps.read_loop import Next, ReadLoop
from api.core.durable_stream import CLOSED, TopicCursor
from api.libs import log_context, metrics

from .endings import EndingLane
from .framing import Framer, observe_write
from .streams import COALESCE, EventStream, RunIds, follow, pause_moved_past
from .watcher import RunWatcher, StreamWatch

logger = logging.getLogger(__name__)

#: Events a writer keeps after delivering them, so that a client slightly behind can still join.
RING = 128
FINISHED, PAUSED = "workflow_finished", "workflow_paused"
_TRANSPORT = ("durable_stream",)


class Outcome(NamedTuple):
    """Why a writer let go of a client: ``ended`` (the response is complete), ``gone`` (its socket
    failed) or ``resume`` (read on alone after ``cursor``, once ``rest`` is written)."""

    kind: str
    cursor: TopicCursor | None = None
    rest: bytes = b""


ENDED, GONE = Outcome("ended"), Outcome("gone")


class Follower:
    """One client's response while a writer serves it."""

    __slots__ = ("chunked", "cursor", "ends_at_pause", "joined_at", "socket", "terminal", "waiter", "writer")

    def __init__(self, socket: Any, *, chunked: bool, continue_on_pause: bool) -> None:
        from gevent.hub import Waiter

        self.socket = socket
        self.chunked = chunked
        #: The events that end this client's stream, as for a client reading alone.
        self.terminal = terminal_events(continue_on_pause)
        self.ends_at_pause = PAUSED in self.terminal
        self.cursor: TopicCursor | None = None
        self.joined_at = 0.0
        self.waiter: Any = Waiter()
        self.writer: TopicWriter | None = None

    def ends_with(self, name: str | None) -> bool:
        return name in self.terminal


class _Framed(NamedTuple):
    cursor: TopicCursor
    name: str | None
    message: bytes
    event: StreamEvent


class _Delivery:
    """Events delivered together, and the bytes each kind of client gets of them: all of them, or up
    to the event that ends its stream (the run's end; for a client that stops at pauses, a pause
    that nothing follows yet)."""

    __slots__ = ("_finished_at", "_framed", "_paused_last", "_wires", "lag_sample")

    def __init__(self, framed: list[_Framed], *, pause_ends: bool) -> None:
        self._framed = framed
        self._finished_at = next((index for index, item in enumerate(framed) if item.name == FINISHED), None)
        self._paused_last = pause_ends and framed[-1].name == PAUSED
        self._wires: dict[tuple[int, bool], bytes] = {}
        first = framed[0].event
        self.lag_sample = first if first.stored is not None else None

    def for_client(self, client: Follower) -> tuple[bytes, TopicCursor, bool]:
        """The bytes for ``client`` as written to its socket, the cursor of the last event in them, and
        whether they end its stream."""
        end = self._finished_at
        if end is None and self._paused_last and client.ends_at_pause:
            end = len(self._framed) - 1
        last = len(self._framed) - 1 if end is None else end
        key = (last, client.chunked)
        wire = self._wires.get(key)
        if wire is None:
            framed = self._framed
            data = framed[0].message if last == 0 else b"".join([item.message for item in framed[: last + 1]])
            wire = self._wires[key] = _wire(data, client.chunked)
        return wire, self._framed[last].cursor, end is not None


def _wire(data: bytes, chunked: bool) -> bytes:
    """``data`` as written to the socket: one HTTP/1.1 chunk, or bare for HTTP/1.0."""
    return b"%X\r\n%b\r\n" % (len(data), data) if chunked else data


def _both_wires(data: bytes) -> dict[bool, bytes]:
    return {True: _wire(data, True), False: data}


class TopicWriter:
    """The writer of one topic (and the run and user its clients are bound to) in this process."""

    def __init__(
        self, registry: SharedWriters, key: tuple[str, bytes], ids: RunIds, framer: Framer, cursor: TopicCursor
    ) -> None:
        self._registry = registry
        self.key = key
        self._ids = ids
        self._framer = framer
        self._ping_wires = _both_wires(framer.ping)
        self.position = cursor
        self.clients: dict[Follower, None] = {}  # in the order they joined
        self.alive = True
        self._ring: list[_Framed] = []
        self._ring_start = 0  # the sequence number of the ring's first event
        self._sequence: dict[TopicCursor, int] = {}
        #: The writer's pings and idle ends, by the rules of a client reading alone, with each client's join time.
        self._loop = ReadLoop(
            terminal=frozenset(),
            now=time.monotonic(),
            ping_interval=registry.ping_interval,
            idle_timeout=registry.idle_timeout,
        )
        self._watch: StreamWatch | None = None
        self._stale_pause = False  # the last event delivered is a pause already followed by more

    # Called from clients' greenlets.

    def join(self, client: Follower, cursor: TopicCursor) -> bool:
        """Serve ``client`` from strictly after ``cursor`` on, if this writer can continue there exactly."""
        if not self.alive:
            return False
        if cursor == self.position:
            missed: list[_Framed] = []
        else:
            number = self._sequence.get(cursor)
            if number is None:
                return False
            missed = self._ring[number - self._ring_start + 1 :]
        client.writer, client.cursor, client.joined_at = self, cursor, time.monotonic()
        self.clients[client] = None
        metrics.STREAMS_OPEN.tally.add(_TRANSPORT)
        if missed:
            self._send_events(client, _Delivery(missed, pause_ends=not self._stale_pause))
        return True

    def leave(self, client: Follower) -> None:
        """Forget ``client`` without waking it (its greenlet is going away)."""
        if self.clients.pop(client, False) is None:
            client.writer = None
            metrics.STREAMS_OPEN.tally.add(_TRANSPORT, -1)

    # The writer's own greenlet.

    def run(self, app: Flask) -> None:
        """Follow the topic for the clients until none is left, the topic ends, or reading it fails."""
        ids = self._ids
        fields = log_context.fields_of(
            app_id=ids.app_id, task_id=ids.task_id, workflow_run_id=ids.run_id, transport=_TRANSPORT[0]
        )
        subscription: Any = None
        watcher = None
        try:
            with app.app_context(), log_context.bound(fields):
                subscription = MessageGenerator.retrieve_events(self._registry.transport(), ids.topic, self.position)
                subscription.__enter__()
                watcher = self._registry.watcher
                self._watch = watcher.watch(ids.run_id, subscription, live_only=False)
                self._follow(subscription)
        except Exception as exc:  # every client reads on alone, and meets the failure itself
            logger.info("run %s: the shared writer stopped: %s", ids.run_id, exc)
        finally:
            self._retire()
            if self.clients:
                metrics.HANDBACKS.tally.add(("failed",), len(self.clients))
            for client in list(self.clients):
                self._release(client, Outcome("resume", client.cursor))
            if watcher is not None and self._watch is not None:
                watcher.unwatch(self._watch)
            if subscription is not None:
                subscription.close()

    def _follow(self, subscription: Any) -> None:
        clock = time.monotonic
        loop = self._loop
        pending: StreamMessage | None = None
        while self.clients:
            if pending is not None:
                item: Any = pending
                pending = None
            else:
                first = next(iter(self.clients))  # the one that joined first times out first
                item = subscription.receive(timeout=loop.wait(clock(), joined=first.joined_at))
            if item is None:
                now = clock()
                self._end_idle(now)
                if self.clients and loop.ping_due(now):
                    for client in list(self.clients):
                        self._push(client, self._ping_wires[client.chunked], client.cursor, ends=False)
                continue
            if item is CLOSED:
                self._end_all()
                return
            batch = [item]
            closed = False
            while len(batch) < COALESCE:
                following = subscription.receive(timeout=0)
                if following is None:
                    break
                if following is CLOSED:
                    closed = True
                    break
                batch.append(following)
            framed = [self._framed(message) for message in batch]
            stale_pause = False
            if framed[-1].name == PAUSED:
                # The rules of a client reading alone (ReadLoop): a pause the run has already left ends nobody.
                ready = False
                if not closed and len(batch) == COALESCE:  # else the batch ended because nothing was ready
                    following = subscription.receive(timeout=0)
                    if following is CLOSED:
                        closed = True
                    elif following is not None:
                        pending, ready = following, True
                step = ReadLoop.looked_ahead(ready=ready, closed=closed)
                if step is Next.ASK_ROW:
                    step = ReadLoop.row_says(moved_past=pause_moved_past(self._ids.run_id, batch[-1].payload))
                stale_pause = step is Next.GO_ON
            loop.event(None, clock())
            self._stale_pause = stale_pause
            delivery = _Delivery(framed, pause_ends=not stale_pause)
            for client in list(self.clients):
                self._send_events(client, delivery)
            if closed:
                self._end_all()
                return

    def drain(self, retry_ms: Callable[[], int]) -> None:
        """The process is going away: end every client with a ``retry:`` (each its own wait)."""
        for client in list(self.clients):
            self._push(client, _wire(self._framer.retry(retry_ms()), client.chunked), client.cursor, ends=True)

    def _framed(self, message: StreamMessage) -> _Framed:
        cursor = message.cursor
        assert cursor is not None  # a durable stream's records all have one
        name = event_name(message.payload)
        event = StreamEvent(name or "", message.payload, cursor, message.stored)
        framed = _Framed(cursor, name, self._framer.event(event), event)
        number = self._ring_start + len(self._ring)
        self._ring.append(framed)
        self._sequence[cursor] = number
        if len(self._ring) >= 2 * RING:
            for dropped in self._ring[:RING]:
                del self._sequence[dropped.cursor]
            del self._ring[:RING]
            self._ring_start += RING
        self.position = cursor
        return framed

    def _send_events(self, client: Follower, delivery: _Delivery) -> None:
        wire, cursor, ends = delivery.for_client(client)
        if delivery.lag_sample is not None and metrics.enabled():
            observe_write(delivery.lag_sample)
        self._push(client, wire, cursor, ends=ends)

    def _push(self, client: Follower, wire: bytes, cursor: TopicCursor | None, *, ends: bool) -> None:
        """Write ``wire`` (framed for the client) without waiting; what does not fit goes back to its greenlet."""
        try:
            sent = client.socket.send(wire, 0, 0.0)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._release(client, GONE)
            return
        if sent < len(wire):
            metrics.HANDBACKS.tally.add(("slow",))
            self._release(client, Outcome("ended" if ends else "resume", cursor, wire[sent:]))
        elif ends:
            self._release(client, ENDED)
        else:
            client.cursor = cursor

    def _release(self, client: Follower, outcome: Outcome) -> None:
        if self.clients.pop(client, False) is not None:
            return  # not one of ours any more
        client.writer = None
        metrics.STREAMS_OPEN.tally.add(_TRANSPORT, -1)
        if outcome.kind == "resume" or outcome.rest:  # it has events to write: at once
            from gevent import get_hub

            get_hub().loop.run_callback(client.waiter.switch, outcome)
        else:
            self._registry.finish(client, outcome)

    def _end_idle(self, now: float) -> None:
        for client in list(self.clients):  # in the order they joined: the first ones time out first
            if not self._loop.idle_over(now, joined=client.joined_at):
                break
            self._release(client, ENDED)

    def _end_all(self) -> None:
        """The topic ended: each client gets the watcher's final event if it ended the stream, then ends."""
        final = None if self._watch is None else self._watch.final_event()
        wires = None if final is None else _both_wires(self._framer.message(encode_event(final)))
        for client in list(self.clients):
            if wires is None:
                self._release(client, ENDED)
            else:
                self._push(client, wires[client.chunked], client.cursor, ends=True)

    def _retire(self) -> None:
        self.alive = False
        self._registry.forget(self)
        metrics.WRITERS_OPEN.tally.add((), -1)


class SharedWriters:
    """This process's writers, by topic, app and user (part of its :class:`~.runtime.DeliveryRuntime`)."""

    def __init__(
        self,
        app: Flask,
        watcher: RunWatcher,
        transport: Callable[[], WorkflowEventTransport],
        *,
        ping_interval: float,
        idle_timeout: float,
    ) -> None:
        self._app = app
        self.watcher = watcher
        self.transport = transport
        self.ping_interval, self.idle_timeout = ping_interval, idle_timeout
        self._writers: dict[tuple[str, bytes], TopicWriter] = {}
        self._endings = EndingLane()

    def join(self, key: tuple[str, bytes], client: Follower, cursor: TopicCursor, ids: RunIds, framer: Framer) -> bool:
        """Have the topic's writer serve ``client`` after ``cursor``; start one there if there is none."""
        import gevent

        writer = self._writers.get(key)
        if writer is not None:
            if writer.join(client, cursor):
                return True
            # The client may be a step ahead: the event it just sent woke the writer too, which has
            # not run yet. Let it run once, or a client woken first every time would never join.
            gevent.sleep(0)
            return writer.join(client, cursor)

        writer = TopicWriter(self, key, ids, framer, cursor)
        self._writers[key] = writer
        metrics.WRITERS_OPEN.tally.add(())
        writer.join(client, cursor)
        gevent.spawn(writer.run, self._app)
        return True

    def drain(self, retry_ms: Callable[[], int]) -> int:
        """End every joined client of every writer with a ``retry:``; returns how many writers there were."""
        writers = list(self._writers.values())
        for writer in writers:
            writer.drain(retry_ms)
        return len(writers)

    def forget(self, writer: TopicWriter) -> None:
        if self._writers.get(writer.key) is writer:
            del self._writers[writer.key]

    def finish(self, client: Follower, outcome: Outcome) -> None:
        """Wake ``client`` with ``outcome`` to end its response, in its turn (``endings``)."""
        self._endings.add(client.waiter.switch, outcome)


def writable_socket(environ: dict[str, Any]) -> Any | None:
    """The client's socket, when this response may be written by a shared writer: served by gunicorn
    on gevent, in the clear (a TLS socket cannot take a partial write back), with a body."""
    socket = environ.get("gunicorn.socket")
    if socket is None or isinstance(socket, ssl.SSLSocket) or environ.get("REQUEST_METHOD") == "HEAD":
        return None
    if not type(socket).__module__.startswith("gevent"):
        return None
    return socket


def shared_body(
    events: EventStream,
    *,
    writers: SharedWriters,
    socket: Any,
    chunked: bool,
    ids: RunIds,
    framer: Framer,
    continue_on_pause: bool,
) -> Generator[bytes, None, None]:
    """The SSE bytes of ``events`` until the client is level with the topic's writer, then the writer's.

    Handed back (a full socket buffer, a failed writer), the client writes the rest itself and reads
    on alone from where it is, until it can join again.
    """
    key = (ids.topic, framer.binding)
    client = Follower(socket, chunked=chunked, continue_on_pause=continue_on_pause)
    items: EventStream | None = events
    try:
        while items is not None:
            joined = False
            try:
                for item in items:
                    yield framer.item(item)
                    cursor = _joinable_at(item, client)
                    del item  # not kept while the next one is awaited
                    if cursor is not None and writers.join(key, client, cursor, ids, framer):
                        joined = True
                        break
            finally:
                items.close()
            items = None
            if not joined:
                return
            outcome: Outcome = client.waiter.get()
            if outcome.rest:
                try:
                    socket.sendall(outcome.rest)
                except OSError:
                    return
            if outcome.kind == "resume" and outcome.cursor is not None:
                items = follow(ids, outcome.cursor, continue_on_pause=continue_on_pause)
    finally:
        if items is not None:
            items.close()
        if client.writer is not None:
            client.writer.leave(client)


def _joinable_at(item: StreamItem, client: Follower) -> TopicCursor | None:
    """The position after ``item`` if the client's stream goes on after it (so it may join a writer there)."""
    last = item if isinstance(item, StreamEvent) else item.events[-1] if isinstance(item, EventBatch) else None
    if last is None or client.ends_with(last.event):
        return None
    return last.cursor
