"""Reading a run's events for an SSE client: where to start, and the ping / idle / terminal loop.

This replaces the old ``MessageGenerator.retrieve_events``: instead of a live subscription whose
start was whatever the broker considered "now", a reader says exactly where it starts — the tail
fixed before the run is dispatched, strictly after a client's last event, or the beginning of the
retained run.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from api.core.durable_stream import CLOSED, TopicCursor

from .event_transport import EventSubscription, StreamMessage, WorkflowEventTransport

DEFAULT_TERMINAL_EVENTS = frozenset({"workflow_finished", "workflow_paused"})


@dataclasses.dataclass(frozen=True)
class Ping:
    pass


PING = Ping()


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    event: dict[str, Any]
    cursor: TopicCursor | None


class MessageGenerator:
    @staticmethod
    def retrieve_events(
        transport: WorkflowEventTransport, topic_name: str, cursor: TopicCursor | None
    ) -> EventSubscription:
        """A reconnecting client's subscription: strictly after ``cursor``, else the whole retained run."""
        return transport.subscribe_resume(topic_name, cursor)


def terminal_events(continue_on_pause: bool) -> frozenset[str]:
    return frozenset({"workflow_finished"}) if continue_on_pause else DEFAULT_TERMINAL_EVENTS


class IncompleteRunError(Exception):
    """The retained events do not begin where the run began: its start is no longer retained."""


def stream_topic_events(
    subscription: EventSubscription,
    *,
    ping_interval: float = 10.0,
    idle_timeout: float = 300.0,
    terminal: frozenset[str] = DEFAULT_TERMINAL_EVENTS,
    on_idle: Callable[[], dict[str, Any] | None] | None = None,
    poll_timeout: float = 1.0,
    first_event: str | None = None,
    first: StreamMessage | None = None,
) -> Iterator[Ping | StreamEvent]:
    """Yield a ping at once, then events; ping when idle; stop at a terminal event, the sealed end,
    or after ``idle_timeout`` without events. The subscription must already be entered.

    ``first`` is a record already taken from the subscription. With ``first_event``, the first
    record must be that event, else :class:`IncompleteRunError` (a reader from the beginning must
    not mistake what is left of a run for the whole run). ``on_idle`` runs while nothing arrives; an
    event it returns is yielded (without a cursor) as the last one.

    Raises:
        IncompleteRunError: The first record is not ``first_event``.
    """
    yield PING
    poll_timeout = min(poll_timeout, ping_interval)
    last_event = last_ping = time.monotonic()
    pending: StreamMessage | None = first
    while True:
        item = pending if pending is not None else subscription.receive(timeout=poll_timeout)
        pending = None
        if item is CLOSED:
            return
        if item is None:
            now = time.monotonic()
            if now - last_event > idle_timeout:
                return
            if on_idle is not None:
                final = on_idle()
                if final is not None:
                    yield StreamEvent(final, None)
                    return
            if now - last_ping >= ping_interval:
                last_ping = now
                yield PING
            continue
        assert isinstance(item, StreamMessage)
        event = json.loads(item.payload)
        name = event.get("event")
        if first_event is not None:
            if name != first_event:
                raise IncompleteRunError(f"the retained events begin with {name!r}, not {first_event!r}")
            first_event = None
        yield StreamEvent(event, item.cursor)
        last_event = time.monotonic()
        if name not in terminal:
            continue
        if name == "workflow_paused":
            # A pause replayed from history may already be followed by the resumed run's events: a
            # stale pause must not end the stream (that is how reconnect loops start).
            following = subscription.receive(timeout=0)
            if isinstance(following, StreamMessage):
                pending = following
                continue
        return
