"""How every reader of a run's events reads: one loop, its rules, and the items a client gets.

Two readers read a run's topic: a client reading alone (its own subscription, :func:`read_alone`)
and a run's shared writer (one subscription for all its clients, ``writer``). Both iterate the same
loop, :func:`batches`, and keep time by the same rules, :class:`ReadLoop`:

- **Batches.** A record that arrives brings along whatever else is ready at once (up to
  ``coalesce`` records): they go out in one write.
- **Pings and idleness.** A ping is due ``ping_interval`` after the last thing sent; a stream ends
  ``idle_timeout`` after its last event. A shared writer keeps one :class:`ReadLoop` for all its
  clients and passes each client's join time as ``joined``: a client that joined after the last
  event is idle from its join, as it would be from the start of its own stream.
- **The first event.** A reader from the beginning of a run must find ``workflow_started`` first
  (else :class:`IncompleteRunError`: what is left of a run is not the run).
- **Terminal events** (:func:`ends_at`). ``workflow_finished`` ends every stream; a pause ends the
  streams of clients that stop at pauses, unless it is stale. The *stale-pause rule* lives in
  :func:`batches`: a pause is stale when the topic already shows more after it, or, with nothing
  after it yet, when the run's row says the run has left it (a form answered a moment ago resumes the
  run before its worker writes anything). A batch says whether its last pause still ends a stream
  (:attr:`Batch.pause_ends`); :func:`ends_at` applies that to a client.

The items a client reading alone yields (:data:`StreamItem`) carry no wire format: the HTTP edge
frames them (``api.controllers.common.sse``) and seals each cursor into an ``id:``.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from api.core.app.apps.event_codec import encode_event, event_name
from api.core.app.apps.event_transport import EventSubscription, StreamMessage
from api.core.durable_stream import CLOSED, Closed, TopicCursor

__all__ = [
    "FINISHED",
    "PAUSED",
    "PING",
    "QUIET",
    "Batch",
    "EventBatch",
    "Idle",
    "IncompleteRunError",
    "Notice",
    "Ping",
    "ReadLoop",
    "Retry",
    "StreamEvent",
    "StreamItem",
    "batches",
    "ends_at",
    "read_alone",
]

FINISHED, PAUSED = "workflow_finished", "workflow_paused"


class IncompleteRunError(Exception):
    """The retained events do not begin where the run began: its start is no longer retained."""


# What a client reading alone yields.


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    """Nothing happened for a while (and once at the start): tells the client the stream is alive."""


PING = Ping()


@dataclasses.dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of the run: its name, its payload exactly as stored, and its position.

    ``cursor`` is ``None`` for an event that was not read from the topic (built from the run row)
    or when the transport is live-only. ``stored`` is the record with its envelope (the writer's
    clock, for the delivery-lag metric), when it had one.
    """

    event: str
    payload: bytes
    cursor: TopicCursor | None
    stored: bytes | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Notice:
    """A message about the stream rather than one of the run's events (``error``); sent as an SSE
    message with that ``event:`` name and never with an ``id:``."""

    event: str
    payload: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class EventBatch:
    """Events of the run that were ready at once, in order: the HTTP edge sends them as one chunk."""

    events: tuple[StreamEvent, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    """The stream's last item when its process is going away: come back in ``milliseconds`` (with
    ``Last-Event-ID``), to another process."""

    milliseconds: int


#: What a client's stream yields to the HTTP edge.
StreamItem = Ping | StreamEvent | EventBatch | Notice | Retry


# The rules.


class Idle(enum.Enum):
    """What a reader does when nothing arrived before its wait ended."""

    WAIT = "wait"
    PING = "ping"
    END = "end"


class ReadLoop:
    """One reader's clock: when it last sent something and its last event, and whether it has met
    its first event. ``now`` is the caller's monotonic clock, passed in so that tests need no clock."""

    __slots__ = ("_first_event", "_idle_timeout", "_last_event", "_last_sent", "_ping_interval")

    def __init__(
        self, *, now: float, ping_interval: float = 10.0, idle_timeout: float = 300.0, first_event: str | None = None
    ) -> None:
        self._ping_interval = ping_interval
        self._idle_timeout = idle_timeout
        self._first_event = first_event
        self._last_event = self._last_sent = now

    def wait(self, now: float, *, joined: float = 0.0) -> float:
        """Seconds the reader may block for its next item before a ping or its idle end is due."""
        idle_end = max(self._last_event, joined) + self._idle_timeout
        return max(min(self._last_sent + self._ping_interval, idle_end) - now, 0.0)

    def nothing(self, now: float) -> Idle:
        """Nothing arrived: end the idle stream, ping (counted as sent), or wait on."""
        if self.idle_over(now):
            return Idle.END
        return Idle.PING if self.ping_due(now) else Idle.WAIT

    def idle_over(self, now: float, *, joined: float = 0.0) -> bool:
        """Whether a stream (one that joined at ``joined``) has gone ``idle_timeout`` without an event."""
        return now - max(self._last_event, joined) >= self._idle_timeout

    def ping_due(self, now: float) -> bool:
        """Whether a ping is due; if so it counts as sent now."""
        if now - self._last_sent < self._ping_interval:
            return False
        self._last_sent = now
        return True

    def events(self, names: Sequence[str | None], now: float) -> None:
        """Events were read (they will be sent).

        Raises:
            IncompleteRunError: The first of them is not the event the reader had to find first.
        """
        if self._first_event is not None:
            if names[0] != self._first_event:
                raise IncompleteRunError(f"the retained events begin with {names[0]!r}, not {self._first_event!r}")
            self._first_event = None
        self._last_event = self._last_sent = now


def ends_at(names: Sequence[str | None], *, pause_ends: bool, stops_at_pauses: bool) -> int | None:
    """The index of the event among ``names`` (read together) that ends a client's stream, if one does:
    the run's end, or for a client that stops at pauses the last event if it is a pause that still
    ends streams (:attr:`Batch.pause_ends`). A pause followed by more in the same batch is stale."""
    for index, name in enumerate(names):
        if name == FINISHED:
            return index
    if stops_at_pauses and pause_ends and names and names[-1] == PAUSED:
        return len(names) - 1
    return None


# The loop.


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """Records read together, in order, with their event names."""

    messages: list[StreamMessage]
    names: list[str | None]
    #: The last record is a pause the run has not left (nothing follows it yet, and the run's row
    #: still waits there): it ends the stream of a client that stops at pauses.
    pause_ends: bool = False
    #: The topic ended after these records (sealed, or its subscription was closed).
    closed: bool = False
    #: The batch ended because nothing more was ready: the reader is level with the topic.
    level: bool = True


#: Nothing arrived before the wait ended (compared by identity).
QUIET = Batch([], [])


def batches(
    subscription: EventSubscription,
    *,
    wait: Callable[[], float],
    coalesce: int,
    left_pause: Callable[[bytes], bool] | None,
    first: StreamMessage | None = None,
) -> Iterator[Batch]:
    """Read ``subscription`` (entered) batch by batch: :data:`QUIET` when ``wait()`` seconds passed with
    nothing, else a :class:`Batch`; the last one has ``closed`` set. ``first`` is a record already
    taken from the subscription.

    ``left_pause(payload)`` says from the run's row whether the run has left the pause ``payload``
    announced; it is asked only about a pause that ends a batch with nothing ready after it. Without
    it (nobody reading stops at pauses), such a pause is taken as still ending streams.

    Records read before a failure are yielded as a batch before the failure is raised.

    Raises:
        DurableStreamError: Reading the subscription failed.
    """
    pending = first
    while True:
        item: StreamMessage | Closed | None
        if pending is not None:
            item, pending = pending, None
        else:
            # While it waits (minutes, for a paused run), the frame holds no delivered record.
            item = None
            item = subscription.receive(timeout=wait())
        if item is None:
            yield QUIET
            continue
        if item is CLOSED:
            yield Batch([], [], closed=True)
            return
        messages = [item]
        closed = False
        try:
            while len(messages) < coalesce:
                following = subscription.receive(timeout=0)
                if following is None:
                    break
                if following is CLOSED:
                    closed = True
                    break
                messages.append(following)
            names = [event_name(message.payload) for message in messages]
            pause_ends = False
            if names[-1] == PAUSED:
                # The stale-pause rule: a pause already followed by more ends nobody.
                ready = False
                if not closed and len(messages) == coalesce:  # else the batch ended because nothing was ready
                    following = subscription.receive(timeout=0)
                    if following is CLOSED:
                        closed = True
                    elif following is not None:
                        pending, ready = following, True
                pause_ends = not ready and (closed or left_pause is None or not left_pause(messages[-1].payload))
        except BaseException:
            # What was read before the failure still goes out, but a pause only with its rule decided:
            # a reader that resumes before it reads it again.
            names = [event_name(message.payload) for message in messages]
            if names[-1] == PAUSED:
                del messages[-1], names[-1]
            if messages:
                yield Batch(messages, names, level=False)
            raise
        yield Batch(messages, names, pause_ends, closed, level=len(messages) < coalesce and pending is None)
        del messages, item
        if closed:
            return


def read_alone(
    subscription: EventSubscription,
    *,
    ping_interval: float = 10.0,
    idle_timeout: float = 300.0,
    continue_on_pause: bool = False,
    on_closed: Callable[[], dict[str, Any] | None] | None = None,
    first_event: str | None = None,
    first: StreamMessage | None = None,
    coalesce: int = 1,
    left_pause: Callable[[bytes], bool] | None = None,
) -> Iterator[Ping | StreamEvent | EventBatch]:
    """The items of one client reading ``subscription`` (entered) alone: a ping at once, then its
    events (those ready together as one :class:`EventBatch`), pings while it is quiet; it ends at its
    terminal event, the topic's end, or after ``idle_timeout`` without events.

    The subscription's watcher ends the stream by closing it; ``on_closed`` then says with which event:
    an event it returns is yielded (without a cursor) as the last one. With ``first_event``, the first
    record must be that event. ``left_pause``: see :func:`batches`.

    Raises:
        IncompleteRunError: The first record is not ``first_event``.
        DurableStreamError: Reading the subscription failed (after yielding what was read before).
    """
    yield PING
    clock = time.monotonic
    rules = ReadLoop(now=clock(), ping_interval=ping_interval, idle_timeout=idle_timeout, first_event=first_event)
    stops_at_pauses = not continue_on_pause
    for batch in batches(
        subscription,
        wait=lambda: rules.wait(clock()),
        coalesce=coalesce,
        left_pause=left_pause if stops_at_pauses else None,
        first=first,
    ):
        if batch is QUIET:
            idle = rules.nothing(clock())
            if idle is Idle.END:
                return
            if idle is Idle.PING:
                yield PING
            continue
        if batch.messages:
            rules.events(batch.names, clock())
            end = ends_at(batch.names, pause_ends=batch.pause_ends, stops_at_pauses=stops_at_pauses)
            count = len(batch.messages) if end is None else end + 1
            events = [
                StreamEvent(name or "", message.payload, message.cursor, message.stored)
                for message, name in zip(batch.messages[:count], batch.names, strict=False)
            ]
            yield events[0] if len(events) == 1 else EventBatch(tuple(events))
            del events
            if end is not None:
                return
        if batch.closed:
            final = None if on_closed is None else on_closed()
            if final is not None:
                yield StreamEvent(str(final["event"]), encode_event(final), None)
            return
