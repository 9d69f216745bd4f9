"""What a shared writer keeps of its clients and of the events it delivers (``writer``).

A :class:`Follower` is one client's response while a writer serves it; a :class:`Framed` event is
framed once for all of a writer's clients; a :class:`Delivery` is the events written together and
the bytes each kind of client gets of them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from api.core.app.apps.message_generator import StreamEvent, terminal_events
from api.core.durable_stream import TopicCursor

FINISHED, PAUSED = "workflow_finished", "workflow_paused"


class Outcome(NamedTuple):
    """Why a writer let go of a client: ``ended`` (the response is complete), ``gone`` (its socket
    failed) or ``resume`` (read on alone after ``cursor``, once ``rest`` is written)."""

    kind: str
    cursor: TopicCursor | None = None
    rest: bytes = b""


ENDED, GONE = Outcome("ended"), Outcome("gone")


class Serving(Protocol):
    """The writer serving a follower (``writer.TopicWriter``), as its response sees it."""

    def leave(self, client: Follower) -> None:
        """Forget ``client`` without waking it (its greenlet is going away)."""
        ...


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
        self.writer: Serving | None = None

    def ends_with(self, name: str | None) -> bool:
        return name in self.terminal


class Framed(NamedTuple):
    """One event as a writer delivered it: its position, its name and its framed bytes."""

    cursor: TopicCursor
    name: str | None
    message: bytes
    event: StreamEvent


class Delivery:
    """Events delivered together, and the bytes each kind of client gets of them: all of them, or up
    to the event that ends its stream (the run's end; for a client that stops at pauses, a pause
    that nothing follows yet)."""

    __slots__ = ("_finished_at", "_framed", "_paused_last", "_wires", "lag_sample")

    def __init__(self, framed: list[Framed], *, pause_ends: bool) -> None:
        self._framed = framed
        self._finished_at = next((index for index, item in enumerate(framed) if item.name == FINISHED), None)
        self._paused_last = pause_ends and framed[-1].name == PAUSED
        self._wires: dict[tuple[int, bool], bytes] = {}
        first = framed[0].event
        self.lag_sample = first if first.stored is not None else None

    def _last(self, client: Follower) -> tuple[int, bool]:
        """The index of the last event ``client`` gets, and whether it ends its stream."""
        end = self._finished_at
        if end is None and self._paused_last and client.ends_at_pause:
            end = len(self._framed) - 1
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
            wire_bytes = self._wires[key] = wire(self.data_for(client)[0], client.chunked)
        return wire_bytes, self._framed[last].cursor, ends


def wire(data: bytes, chunked: bool) -> bytes:
    """``data`` as written to the socket: one HTTP/1.1 chunk, or bare for HTTP/1.0."""
    return b"%X\r\n%b\r\n" % (len(data), data) if chunked else data


def both_wires(data: bytes) -> dict[bool, bytes]:
    return {True: wire(data, True), False: data}
