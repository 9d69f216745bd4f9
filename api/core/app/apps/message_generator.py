"""Reading a run's events for a client: where a reader starts, and the ping / idle / terminal loop.

:meth:`MessageGenerator.retrieve_events` is the one place that decides where a reader starts:

- ``StartAt.TAIL``: a streaming request or a blocking one, fixed *before* its run is dispatched, so
  every event of the run arrives;
- a ``TopicCursor``: a reconnecting client, strictly after the last event it received;
- ``StartAt.BEGINNING``: a reconnecting client without a cursor, from the beginning of what is
  retained of the run.

:func:`stream_topic_events` turns a subscription into domain items — :class:`StreamEvent` (the
event's name, its payload bytes as stored and its cursor) and :data:`PING` — without re-encoding
anything; the HTTP edge frames them as SSE and seals the cursors into resume tokens.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Iterator
from typing import Any

from api.core.durable_stream import CLOSED, Closed, TopicCursor

from .event_codec import encode_event, event_name
from .event_transport import EventSubscription, StreamMessage, WorkflowEventTransport
from .read_loop import Idle, IncompleteRunError, Next, ReadLoop

__all__ = [
    "DEFAULT_TERMINAL_EVENTS",
    "PING",
    "EventBatch",
    "IncompleteRunError",
    "MessageGenerator",
    "Notice",
    "Ping",
    "Retry",
    "StartAt",
    "StreamEvent",
    "StreamItem",
    "stream_topic_events",
    "terminal_events",
]

DEFAULT_TERMINAL_EVENTS = frozenset({"workflow_finished", "workflow_paused"})


class StartAt(enum.Enum):
    """Where a reader without a cursor starts."""

    #: The current end of the topic: everything appended after the subscription is made.
    TAIL = "tail"
    #: The first retained record of the topic.
    BEGINNING = "beginning"


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
    """A message about the stream rather than one of the run's events (``run_created``, ``error``);
    sent as an SSE message with that ``event:`` name and never with an ``id:``."""

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


#: What an event stream yields to the HTTP edge.
StreamItem = Ping | StreamEvent | EventBatch | Notice | Retry


class MessageGenerator:
    @staticmethod
    def retrieve_events(
        transport: WorkflowEventTransport, topic_name: str, start: StartAt | TopicCursor
    ) -> EventSubscription:
        """The subscription of a reader of ``topic_name`` that starts at ``start`` (not yet entered).

        On a live-only transport every reader gets what is published from now on, whatever ``start`` says.
        """
        if start is StartAt.TAIL:
            return transport.subscribe_live(topic_name)
        if start is StartAt.BEGINNING:
            return transport.subscribe_resume(topic_name, None)
        return transport.subscribe_resume(topic_name, start)


def terminal_events(continue_on_pause: bool) -> frozenset[str]:
    return frozenset({"workflow_finished"}) if continue_on_pause else DEFAULT_TERMINAL_EVENTS


def stream_topic_events(
    subscription: EventSubscription,
    *,
    ping_interval: float = 10.0,
    idle_timeout: float = 300.0,
    terminal: frozenset[str] = DEFAULT_TERMINAL_EVENTS,
    on_closed: Callable[[], dict[str, Any] | None] | None = None,
    first_event: str | None = None,
    first: StreamMessage | None = None,
    coalesce: int = 1,
    pause_moved_past: Callable[[bytes], bool] | None = None,
) -> Iterator[Ping | StreamEvent | EventBatch]:
    """Yield a ping at once, then events; ping after ``ping_interval`` without anything sent; stop at
    a terminal event, the sealed end, or after ``idle_timeout`` without events. The subscription
    must already be entered. The rules are :class:`~.read_loop.ReadLoop`'s; this drives it.

    While nothing arrives the reader blocks in ``receive`` until the next ping is due: no timer
    per stream fires in between. Whoever watches the run from outside (a per-process watcher)
    ends the stream by closing the subscription; ``on_closed`` then says with which event: an
    event it returns is yielded (without a cursor) as the last one.

    ``first`` is a record already taken from the subscription. With ``first_event``, the first
    record must be that event, else :class:`IncompleteRunError` (a reader from the beginning must
    not mistake what is left of a run for the whole run).

    With ``coalesce`` > 1, the records that are ready when one arrives (up to that many in all) are
    yielded together, as an :class:`EventBatch` (a lone event is yielded as itself).

    A pause followed by nothing yet is asked about: ``pause_moved_past(payload)`` says from outside
    (the run's row) whether the run has left it already; without it, such a pause ends the stream.

    Raises:
        IncompleteRunError: The first record is not ``first_event``.
    """
    yield PING
    clock = time.monotonic
    rules = ReadLoop(
        terminal=terminal, now=clock(), ping_interval=ping_interval, idle_timeout=idle_timeout, first_event=first_event
    )
    pending: StreamMessage | None = first
    first = None
    batch: list[StreamEvent] = []
    item: StreamMessage | Closed | None
    event: StreamEvent | None = None
    while True:
        if pending is not None:
            item, pending = pending, None
        elif batch:
            # Take what else is ready now, without waiting; then send the batch.
            try:
                item = subscription.receive(timeout=0) if len(batch) < coalesce else None
            except BaseException:
                yield _batched(batch)  # what was read before the failure still goes out
                raise
            if item is None:
                yield _batched(batch)
                batch = []
                continue
        else:
            # While it waits (minutes, for a paused run), the frame holds no delivered record.
            item = event = None
            item = subscription.receive(timeout=rules.wait(clock()))
        if item is CLOSED:
            if batch:
                yield _batched(batch)
            final = None if on_closed is None else on_closed()
            if final is not None:
                yield StreamEvent(str(final["event"]), encode_event(final), None)
            return
        if item is None:
            idle = rules.nothing(clock())
            if idle is Idle.END:
                return
            if idle is Idle.PING:
                yield PING
            continue
        name = event_name(item.payload)
        step = rules.event(name, clock())
        event = StreamEvent(name or "", item.payload, item.cursor, item.stored)
        if step is Next.LOOK_AHEAD:
            try:
                following = subscription.receive(timeout=0)
            except BaseException:
                if batch:
                    yield _batched(batch)
                raise
            if isinstance(following, StreamMessage):
                pending = following
            step = rules.looked_ahead(ready=pending is not None, closed=following is CLOSED)
            if step is Next.ASK_ROW:
                moved_past = pause_moved_past is not None and pause_moved_past(item.payload)
                step = rules.row_says(moved_past=moved_past)
        if step is Next.END:
            batch.append(event)
            yield _batched(batch)
            return
        if coalesce > 1:
            batch.append(event)
        else:
            yield event


def _batched(events: list[StreamEvent]) -> StreamEvent | EventBatch:
    return events[0] if len(events) == 1 else EventBatch(tuple(events))
