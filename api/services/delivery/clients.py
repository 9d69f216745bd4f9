"""A client's response when a shared writer may write its socket (``writer``), and what a writer keeps of it.

The response body (:func:`shared_body`) arrives at its run's writer with what it missed, or reads
alone until it is level with the writer and joins it; then it parks while the writer writes. A
:class:`Follower` is that response as the writer sees it; a :class:`Delivery` is the events a writer
writes together and the bytes each kind of client gets of them (:func:`~.reading.ends_at` decides
where a client's stream ends). Handed back (its socket buffer is full, or the writer's read failed,
see :class:`Outcome`), the response writes the rest itself and reads on alone from where it is,
until it can join again.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Generator, Iterator
from typing import Any, NamedTuple, Protocol

from api.core.durable_stream import TopicCursor
from api.libs import metrics

from ..credentials import Credential
from .alone import RunIds, follow
from .framing import Framer, observe_write
from .reading import FINISHED, PAUSED, EventBatch, StreamEvent, StreamItem, ends_at


class Outcome(NamedTuple):
    """Why a writer let go of a client: ``ended`` (the response is complete), ``gone`` (its socket
    failed) or ``resume`` (read on alone after ``cursor``, once ``rest`` is written)."""

    kind: str
    cursor: TopicCursor | None = None
    rest: bytes = b""


ENDED, GONE = Outcome("ended"), Outcome("gone")


class Serving(Protocol):
    """The writer serving a follower (``writer.TopicWriter``), as its response sees it."""

    #: The topic and the binding of the resume tokens of its clients (its key among the process's writers).
    key: tuple[str, bytes]
    #: Clients that arrived and have not joined (or let go) yet.
    expected: int

    def join(self, client: Follower, cursor: TopicCursor | None) -> bool:
        """Serve ``client`` from strictly after ``cursor`` on, if the writer can continue there exactly."""
        ...

    def leave(self, client: Follower) -> None:
        """Forget ``client`` without waking it (its greenlet is going away)."""
        ...


class Writers(Protocol):
    """A process's writers (``writer.SharedWriters``), as a response sees them."""

    def join(self, key: tuple[str, bytes], client: Follower, cursor: TopicCursor, ids: RunIds, framer: Framer) -> bool:
        """Have the topic's writer serve ``client`` after ``cursor``, if it can continue there exactly."""
        ...


class Follower:
    """One client's response while a writer serves it."""

    __slots__ = (
        "chunked",
        "credential",
        "cursor",
        "joined_at",
        "revocation",
        "socket",
        "stops_at_pauses",
        "waiter",
        "writer",
    )

    def __init__(
        self, socket: Any, *, chunked: bool, continue_on_pause: bool, credential: Credential | None = None
    ) -> None:
        from gevent.hub import Waiter

        self.socket = socket
        #: What the request proved: the writer ends the client if it is revoked while joined.
        self.credential = credential
        #: Its registration with the process's credential watch while joined.
        self.revocation: Any = None
        self.chunked = chunked
        self.stops_at_pauses = not continue_on_pause
        self.cursor: TopicCursor | None = None
        self.joined_at = 0.0
        self.waiter: Any = Waiter()
        self.writer: Serving | None = None


class Framed(NamedTuple):
    """One event as a writer delivered it: its position, its name and its framed bytes."""

    cursor: TopicCursor
    name: str | None
    message: bytes
    event: StreamEvent


class Arrival(NamedTuple):
    """A client's way in at its run's writer without a read of its own: the writer, and what it delivered
    after the client's start (framed, to be sent before the client joins at ``cursor``)."""

    writer: Serving
    missed: list[Framed]
    cursor: TopicCursor | None
    pause_ends: bool

    def cancel(self) -> None:
        """The response will not be sent (its request failed after arriving): no longer expected."""
        self.writer.expected -= 1


class Delivery:
    """Events delivered together, and the bytes each kind of client gets of them: all of them, or up
    to the event that ends its stream."""

    __slots__ = ("_framed", "_names", "_pause_ends", "_wire", "_wires", "lag_sample")

    def __init__(self, framed: list[Framed], *, pause_ends: bool, wire: Callable[[bytes, bool], bytes]) -> None:
        self._framed = framed
        self._names = [item.name for item in framed]
        self._pause_ends = pause_ends
        self._wire = wire
        self._wires: dict[tuple[int, bool], bytes] = {}
        first = framed[0].event
        self.lag_sample = first if first.stored is not None else None

    def _last(self, client: Follower) -> tuple[int, bool]:
        """The index of the last event ``client`` gets, and whether it ends its stream."""
        end = ends_at(self._names, pause_ends=self._pause_ends, stops_at_pauses=client.stops_at_pauses)
        return (len(self._framed) - 1 if end is None else end), end is not None

    def data_for(self, client: Follower) -> tuple[bytes, TopicCursor, bool]:
        """The SSE bytes for ``client``, the cursor of the last event in them, and whether they end its stream."""
        last, ends = self._last(client)
        framed = self._framed
        data = framed[0].message if last == 0 else b"".join([item.message for item in framed[: last + 1]])
        return data, framed[last].cursor, ends

    def for_client(self, client: Follower) -> tuple[bytes, TopicCursor, bool]:
        """:meth:`data_for` as written to the client's socket (the same bytes for every client of its kind)."""
        last, ends = self._last(client)
        key = (last, client.chunked)
        wire_bytes = self._wires.get(key)
        if wire_bytes is None:
            wire_bytes = self._wires[key] = self._wire(self.data_for(client)[0], client.chunked)
        return wire_bytes, self._framed[last].cursor, ends


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
    events: Iterator[StreamItem] | None,
    *,
    writers: Writers,
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
    client = Follower(socket, chunked=chunked, continue_on_pause=continue_on_pause, credential=ids.credential)
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
                    _close(items)
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
            _close(items)
        if client.writer is not None:
            client.writer.leave(client)


def _close(items: Iterator[StreamItem]) -> None:
    close = getattr(items, "close", None)
    if close is not None:
        close()


def _arrive(
    arrival: Arrival, client: Follower, ids: RunIds, framer: Framer, *, continue_on_pause: bool
) -> Generator[bytes, None, tuple[bool, Iterator[StreamItem] | None]]:
    """The first bytes of an arriving client (a ping, what it missed), then its join: whether it
    joined, and else what it reads alone."""
    writer, cursor = arrival.writer, arrival.cursor
    try:
        if not arrival.missed:
            yield framer.ping
        else:
            delivery = Delivery(arrival.missed, pause_ends=arrival.pause_ends, wire=framer.wire)
            data, cursor, ends = delivery.data_for(client)
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
    if last is None or last.cursor is None:
        return None
    if last.event == PAUSED and client.stops_at_pauses:
        return None  # it ended the stream of a client that stops at pauses (a stale pause is read on)
    return None if last.event == FINISHED else last.cursor
