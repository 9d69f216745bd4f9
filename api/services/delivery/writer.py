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
  or one of the events it keeps (its history, ``SSE_WRITER_HISTORY``; it sends the client what came
  after first). A client that is behind or ahead reads on and tries again after its next event.
- A client that arrives at a live run with a cursor or for its whole history (``arrive``) starts
  from the writer's history without a read of its own: thousands arriving at once (a deploy, a
  crashed worker) cost one read of the run per process, not one each. A writer always starts at
  the topic's beginning (for a client arriving or one level with it), and its history is the run's
  whole (``complete``) until it drops some; a client it cannot serve reads alone as before.
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

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Flask

from api.core.app.apps.event_codec import encode_event
from api.core.app.apps.event_transport import StreamMessage
from api.core.app.apps.message_generator import MessageGenerator, StartAt
from api.core.durable_stream import TopicCursor
from api.libs import log_context, metrics

from .alone import COALESCE, RunIds, current_transport
from .clients import ENDED, GONE, Arrival, Delivery, Follower, Framed, Outcome
from .credential_watch import KEY_REVOKED_MESSAGE, CredentialWatch
from .endings import EndingLane
from .framing import Framer, observe_write
from .reading import FINISHED, QUIET, Notice, ReadLoop, StreamEvent, batches
from .run_cards import RunCards
from .watcher import RunWatcher, StreamWatch, left_pause

logger = logging.getLogger(__name__)

_TRANSPORT = ("durable_stream",)
#: How long an arriving client waits for a new writer to read what its topic holds. Waiting costs a
#: parked greenlet; giving up costs a read of the run of its own, and in a herd those reads queue
#: before the writer's own (measured: with 5 s, one client in six of 6,000 gave up and read alone).
ARRIVAL_PATIENCE = 30.0
#: How long a writer without clients stays for the ones that arrived (a response whose body never
#: started would otherwise keep it forever).
ARRIVAL_HOLD = 60.0


class TopicWriter:
    """The writer of one topic (and the run and user its clients are bound to) in this process."""

    def __init__(
        self,
        registry: SharedWriters,
        key: tuple[str, bytes],
        ids: RunIds,
        framer: Framer,
        epoch: str | None = None,
    ) -> None:
        from gevent.event import Event

        self._registry = registry
        self.key = key
        self._ids = ids
        self._framer = framer
        self._ping_wires = {chunked: framer.wire(framer.ping, chunked) for chunked in (False, True)}
        #: The position after the last event delivered (``None``: before the topic's first; a writer
        #: always reads its topic from the beginning).
        self.position: TopicCursor | None = None
        #: Whether its history is the run's whole: ``workflow_started`` came first, on the run's
        #: incarnation (``epoch``, when known), and it has dropped nothing since.
        self.complete = True
        self._epoch = epoch
        #: Set once it has read what its topic held when it started (or it stopped).
        self.loaded = Event()
        self.clients: dict[Follower, None] = {}  # in the order they joined
        self.alive = True
        self._ring: list[Framed] = []
        self._ring_start = 0  # the sequence number of the ring's first event
        self._sequence: dict[TopicCursor, int] = {}
        #: The writer's pings and idle ends, by the rules of a client reading alone, with each client's join time.
        self._loop = ReadLoop(
            now=time.monotonic(),
            ping_interval=registry.ping_interval,
            idle_timeout=registry.idle_timeout,
        )
        self._watch: StreamWatch | None = None
        #: Whether the last event delivered, if a pause, still ends the streams of clients that stop at pauses.
        self.pause_ends = True
        #: Clients that arrived (:meth:`SharedWriters.arrive`) and have not joined yet, and when the last came.
        self.expected = 0
        self.arrived_at = 0.0

    # Called from clients' greenlets.

    def missed_after(self, cursor: TopicCursor | None) -> list[Framed] | None:
        """What this writer delivered after ``cursor`` (``None``: the run's start), or ``None`` if it
        cannot continue there exactly."""
        if not self.alive:
            return None
        if cursor == self.position:
            return []
        if cursor is None:
            return list(self._ring) if self.complete else None
        number = self._sequence.get(cursor)
        return None if number is None else self._ring[number - self._ring_start + 1 :]

    def at_tail(self) -> tuple[list[Framed], TopicCursor | None] | None:
        """Where a client that needs nothing from the past starts (Dify's reader without a cursor or a
        snapshot): at this writer's position, with nothing missed; or, once the run has ended, with its
        ``workflow_finished`` alone, as a client reading alone would get it from the run's row.
        ``None`` if this writer no longer delivers its topic."""
        if not self.alive:
            return None
        last = self._ring[-1] if self._ring else None
        if last is not None and last.name == FINISHED and last.cursor == self.position:
            return [last], self.position
        return [], self.position

    def join(self, client: Follower, cursor: TopicCursor | None) -> bool:
        """Serve ``client`` from strictly after ``cursor`` on, if this writer can continue there exactly."""
        missed = self.missed_after(cursor)
        if missed is None:
            return False
        client.writer, client.cursor, client.joined_at = self, cursor, time.monotonic()
        self.clients[client] = None
        client.revocation = self._registry.credentials.watch(client.credential, lambda: self.revoke(client))
        metrics.STREAMS_OPEN.tally.add(_TRANSPORT)
        if missed:
            self._send_events(client, Delivery(missed, pause_ends=self.pause_ends, wire=self._framer.wire))
        return True

    def leave(self, client: Follower) -> None:
        """Forget ``client`` without waking it (its greenlet is going away)."""
        if self.clients.pop(client, False) is None:
            self._forget(client)

    def revoke(self, client: Follower) -> None:
        """The credential ``client`` was opened with is revoked: its stream ends with an ``error`` event."""
        if client not in self.clients:
            return
        body = {"code": "key_revoked", "message": KEY_REVOKED_MESSAGE, "status": 401}
        notice = self._framer.item(Notice("error", encode_event(body)))
        self._push(client, self._framer.wire(notice, client.chunked), client.cursor, ends=True, at_once=True)

    def _forget(self, client: Follower) -> None:
        client.writer = None
        self._registry.credentials.unwatch(client.revocation)
        client.revocation = None
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
                transport = current_transport()
                subscription = MessageGenerator.retrieve_events(transport, ids.topic, StartAt.BEGINNING)
                subscription.__enter__()
                if self._epoch is not None:  # checked after entering, as a reader alone does
                    info = transport.topic_info(ids.topic)
                    self.complete = info is not None and info.epoch == self._epoch
                watcher = self._registry.watcher
                self._watch = watcher.watch(ids.run_id, subscription, live_only=False)
                self._follow(subscription)
        except Exception as exc:  # every client reads on alone, and meets the failure itself
            logger.info("run %s: the shared writer stopped: %s", ids.run_id, exc)
        finally:
            self._retire()
            self.loaded.set()
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

        def wait() -> float:
            if not self.loaded.is_set():
                # The arrivals wait for it to read what its topic holds: not for a ping first (an
                # empty topic, or a history that filled its last batch exactly).
                return 0.0
            first = next(iter(self.clients), None)  # the one that joined first times out first
            return loop.wait(clock(), joined=first.joined_at if first else clock())

        for batch in batches(
            subscription, wait=wait, coalesce=COALESCE, left_pause=functools.partial(left_pause, self._ids.run_id)
        ):
            if batch is QUIET:
                self.loaded.set()  # level with the topic: the clients waiting to arrive may come
                now = clock()
                self._end_idle(now)
                if loop.ping_due(now):  # due even without clients: else the next wait would be 0, again and again
                    for client in list(self.clients):
                        self._push(client, self._ping_wires[client.chunked], client.cursor, ends=False)
            elif batch.messages:
                framed = [
                    self._framed(message, name) for message, name in zip(batch.messages, batch.names, strict=True)
                ]
                loop.events(batch.names, clock())
                self.pause_ends = batch.pause_ends
                delivery = Delivery(framed, pause_ends=batch.pause_ends, wire=self._framer.wire)
                for client in list(self.clients):
                    self._send_events(client, delivery)
                if batch.level:
                    self.loaded.set()
            if batch.closed:
                self._end_all()
                return
            if not self._wanted():
                return

    def _wanted(self) -> bool:
        """Whether it still has clients, or clients that arrived and have not joined yet."""
        if self.clients or not self.loaded.is_set():
            return True
        return bool(self.expected) and time.monotonic() - self.arrived_at < ARRIVAL_HOLD

    def drain(self, retry_ms: Callable[[], int]) -> None:
        """The process is going away: end every client with a ``retry:`` (each its own wait), at once: not
        through the ending lane, which closes a few at a time when the loop is idle (a client comes back
        only once its connection closes, and the process has its graceful timeout to close them all)."""
        for client in list(self.clients):
            retry = self._framer.wire(self._framer.retry(retry_ms()), client.chunked)
            self._push(client, retry, client.cursor, ends=True, at_once=True)

    def _framed(self, message: StreamMessage, name: str | None) -> Framed:
        cursor = message.cursor
        assert cursor is not None  # a durable stream's records all have one
        event = StreamEvent(name or "", message.payload, cursor, message.stored)
        framed = Framed(cursor, name, self._framer.event(event), event)
        number = self._ring_start + len(self._ring)
        if number == 0 and name != "workflow_started":
            self.complete = False  # what is left of a run is not the run
        self._ring.append(framed)
        self._sequence[cursor] = number
        history = self._registry.history
        if len(self._ring) > history:
            dropped = max(history // 4, 1)  # a quarter at a time: the list is not shifted per event
            for old in self._ring[:dropped]:
                del self._sequence[old.cursor]
            del self._ring[:dropped]
            self._ring_start += dropped
            self.complete = False
        self.position = cursor
        return framed

    def _send_events(self, client: Follower, delivery: Delivery) -> None:
        wire, cursor, ends = delivery.for_client(client)
        if delivery.lag_sample is not None and metrics.enabled():
            observe_write(delivery.lag_sample)
        self._push(client, wire, cursor, ends=ends)

    def _push(
        self, client: Follower, wire: bytes, cursor: TopicCursor | None, *, ends: bool, at_once: bool = False
    ) -> None:
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
            self._release(client, ENDED, at_once=at_once)
        else:
            client.cursor = cursor

    def _release(self, client: Follower, outcome: Outcome, *, at_once: bool = False) -> None:
        if self.clients.pop(client, False) is not None:
            return  # not one of ours any more
        self._forget(client)
        if outcome.kind == "resume" or outcome.rest or at_once:  # it has events to write, or must end now
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
        message = None if final is None else self._framer.message(encode_event(final))
        wires = None if message is None else {chunked: self._framer.wire(message, chunked) for chunked in (False, True)}
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
        *,
        ping_interval: float,
        idle_timeout: float,
        history: int = 1024,
        credentials: CredentialWatch | None = None,
    ) -> None:
        self._app = app
        self.watcher = watcher
        #: Ends a joined client whose credential is revoked.
        self.credentials = credentials or CredentialWatch(app, interval=1.0)
        self.ping_interval, self.idle_timeout = ping_interval, idle_timeout
        #: Events a writer keeps after delivering them, for the clients that arrive or join behind it.
        self.history = max(history, 1)
        self._writers: dict[tuple[str, bytes], TopicWriter] = {}
        self._endings = EndingLane()
        #: The rows of the runs these writers deliver, for the arrivals at them (:mod:`.run_cards`).
        self.cards = RunCards(self._delivering)

    def _delivering(self, key: tuple[str, bytes]) -> bool:
        # Loaded or still loading: while a new writer reads its run, the arrivals that wait for it must
        # not each read the run's row (in a herd those reads kept the loop too busy for it to load).
        writer = self._writers.get(key)
        return writer is not None and writer.alive and not self.watcher.draining

    def join(self, key: tuple[str, bytes], client: Follower, cursor: TopicCursor, ids: RunIds, framer: Framer) -> bool:
        """Have the topic's writer serve ``client`` after ``cursor``, if it can continue there exactly.

        Without a writer, one starts at the topic's beginning (not at the client's cursor: its history
        is then the run's whole, for the clients that arrive later, see :meth:`arrive`), and the client
        waits until it has read what the topic holds.
        """
        import gevent

        writer = self._loaded(key, ids, framer)
        writer.expected -= 1  # (joining, or reading on alone: either way no longer expected)
        if writer.join(client, cursor):
            return True
        # The client may be a step ahead: the event it just sent woke the writer too, which has
        # not run yet. Let it run once, or a client woken first every time would never join.
        gevent.sleep(0)
        return writer.join(client, cursor)

    def arrive(
        self, key: tuple[str, bytes], ids: RunIds, framer: Framer, start: StartAt | TopicCursor, *, epoch: str | None
    ) -> Arrival | None:
        """A way in for a client through the topic's writer, without a read of its own: strictly after a
        cursor, at the run's start (``StartAt.BEGINNING``: a snapshot, or a run being started), or at the
        live tail (``StartAt.TAIL``); ``None`` if the writer cannot continue there exactly.

        Without a writer, one starts from the topic's beginning, so that the clients arriving after it
        find the run's history in it: the first one waits (at most :data:`ARRIVAL_PATIENCE`) until it
        has read what the topic holds; so do the others that come meanwhile.
        """
        if self.watcher.draining:
            return None
        writer = self._loaded(key, ids, framer, epoch)
        if start is StartAt.TAIL:
            found = writer.at_tail()
            if found is None:
                writer.expected -= 1
                return None
            missed, position = found
            return Arrival(writer, missed, position, pause_ends=True)
        cursor = None if start is StartAt.BEGINNING else start
        behind = writer.missed_after(cursor)
        if behind is None:
            writer.expected -= 1
            return None
        return Arrival(writer, behind, behind[-1].cursor if behind else cursor, pause_ends=writer.pause_ends)

    def _loaded(self, key: tuple[str, bytes], ids: RunIds, framer: Framer, epoch: str | None = None) -> TopicWriter:
        """The topic's writer (started at the topic's beginning if there is none) once it has read what
        the topic holds, or :data:`ARRIVAL_PATIENCE` has passed. The caller is counted as ``expected``
        (which keeps a writer without clients alive) until it joins or lets go."""
        import gevent

        writer = self._writers.get(key)
        if writer is None:
            writer = TopicWriter(self, key, ids, framer, epoch)
            self._writers[key] = writer
            metrics.WRITERS_OPEN.tally.add(())
            gevent.spawn(writer.run, self._app)
        writer.expected += 1
        writer.arrived_at = time.monotonic()
        if not writer.loaded.is_set():
            try:
                writer.loaded.wait(ARRIVAL_PATIENCE)
            except BaseException:
                writer.expected -= 1
                raise
        return writer

    def drain(self, retry_ms: Callable[[], int]) -> int:
        """End every joined client of every writer with a ``retry:``; returns how many writers there were."""
        writers = list(self._writers.values())
        for writer in writers:
            writer.drain(retry_ms)
        return len(writers)

    def forget(self, writer: TopicWriter) -> None:
        if self._writers.get(writer.key) is writer:
            del self._writers[writer.key]
            self.cards.forget(writer.key)

    def finish(self, client: Follower, outcome: Outcome) -> None:
        """Wake ``client`` with ``outcome`` to end its response, in its turn (``endings``)."""
        self._endings.add(client.waiter.switch, outcome)
