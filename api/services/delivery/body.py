"""A client's response body when a shared writer may write it (``writer``): the client reads alone
until it is level with its run's writer, or arrives at it with what it missed, then parks while the
writer writes; handed back, it writes the rest itself and reads on alone until it can join again.
"""

from __future__ import annotations

import ssl
from collections.abc import Generator
from typing import Any

from api.core.app.apps.message_generator import EventBatch, StreamEvent, StreamItem
from api.core.durable_stream import TopicCursor
from api.libs import metrics

from .followers import Delivery, Follower, Outcome
from .framing import Framer, observe_write
from .streams import EventStream, RunIds, follow
from .writer import Arrival, SharedWriters


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
    events: EventStream | None,
    *,
    writers: SharedWriters,
    socket: Any,
    chunked: bool,
    ids: RunIds,
    framer: Framer,
    continue_on_pause: bool,
    arrival: Arrival | None = None,
) -> Generator[bytes, None, None]:
    """The SSE bytes of ``events`` until the client is level with the topic's writer, then the writer's.

    With an ``arrival`` (and no ``events``), the client starts with what the writer delivered after
    its start and joins it at once. Handed back (a full socket buffer, a failed writer), the client
    writes the rest itself and reads on alone from where it is, until it can join again.
    """
    key = (ids.topic, framer.binding)
    client = Follower(socket, chunked=chunked, continue_on_pause=continue_on_pause)
    items = events
    joined = False
    try:
        if arrival is not None:
            joined, items = yield from _arrive(arrival, client, ids, framer, continue_on_pause=continue_on_pause)
        while joined or items is not None:
            if not joined and items is not None:
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
            joined = False
            outcome: Outcome = client.waiter.get()
            if outcome.rest:
                try:
                    socket.sendall(outcome.rest)
                except OSError:
                    return
            if outcome.kind == "resume":  # (an arrival joined at its run's start has no cursor yet)
                items = follow(ids, outcome.cursor, continue_on_pause=continue_on_pause)
    finally:
        if items is not None:
            items.close()
        if client.writer is not None:
            client.writer.leave(client)


def _arrive(
    arrival: Arrival, client: Follower, ids: RunIds, framer: Framer, *, continue_on_pause: bool
) -> Generator[bytes, None, tuple[bool, EventStream | None]]:
    """The first bytes of an arriving client (a ping, what it missed), then its join: whether it
    joined, and else what it reads alone."""
    writer, cursor = arrival.writer, arrival.cursor
    try:
        if not arrival.missed:
            yield framer.ping
        else:
            data, cursor, ends = Delivery(arrival.missed, pause_ends=arrival.pause_ends).data_for(client)
            if metrics.enabled():
                lead = arrival.missed[0].event
                if lead.stored is not None:
                    observe_write(lead, framer.since, len(arrival.missed))
            yield framer.ping + data  # one write, with the headers' (a herd's every syscall counts)
            if ends:
                return False, None
        if writer.join(client, cursor):
            return True, None
    finally:
        writer.expected -= 1
    return False, follow(ids, cursor, continue_on_pause=continue_on_pause)


def _joinable_at(item: StreamItem, client: Follower) -> TopicCursor | None:
    """The position after ``item`` if the client's stream goes on after it (so it may join a writer there)."""
    last = item if isinstance(item, StreamEvent) else item.events[-1] if isinstance(item, EventBatch) else None
    if last is None or client.ends_with(last.event):
        return None
    return last.cursor
