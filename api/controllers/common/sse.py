"""Server-sent events on the wire: ``id:`` (optional), ``event:`` (optional) and ``data:`` lines.

The HTTP edge of the event streams. :class:`SseFramer` frames the items delivery yields:
a run's event goes out as ``id: <resume token>`` + ``data: <payload as stored>``, a notice as
``event: <name>`` + ``data: …``, a ping as ``event: ping``.

Messages are built as bytes straight from the stored payload (no decode and re-encode); every item
is one chunk, so the events of an :class:`~api.services.delivery.reading.EventBatch` (those
that were ready at once) go out in one write to the client's socket.

Each write of events is one delivery-lag sample (``api.libs.metrics``), taken from the first event
of the write (the one that waited longest), when metrics are on: one flag test per write otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

from api.core.durable_stream import TopicCursor
from api.libs import metrics
from api.libs.resume_token import StreamSealer
from api.services.delivery.framing import observe_write
from api.services.delivery.reading import EventBatch, Ping, Retry, StreamEvent, StreamItem

PING = b"event: ping\n\n"

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_message(data: bytes, event_id: bytes | None = None, event: str | None = None) -> bytes:
    """One SSE message; ``data`` as it is sent (stored payloads are ASCII JSON)."""
    head = b"" if event_id is None else b"id: %b\n" % event_id
    if event is not None:
        head += b"event: %b\n" % event.encode()
    if b"\n" in data:  # a data field may not contain a newline; stored events never do, but stay correct
        return head + b"".join(b"data: %b\n" % line for line in data.split(b"\n")) + b"\n"
    return head + b"data: %b\n\n" % data


def sse_chunk(item: StreamItem, resume_token: Callable[[TopicCursor], bytes], since: float = 0.0) -> bytes:
    """The SSE bytes of one item (one chunk); a write of events is one sample: of the delivery lag if
    they were appended after ``since`` (the request's start, ``time.time()``), else of the replay."""
    if isinstance(item, StreamEvent):
        if item.stored is not None and metrics.enabled():
            observe_write(item, since)
        return event_message(item, resume_token)
    if isinstance(item, EventBatch):
        if item.events[0].stored is not None and metrics.enabled():
            observe_write(item.events[0], since, len(item.events))
        return b"".join([event_message(event, resume_token) for event in item.events])
    if isinstance(item, Ping):
        return PING
    if isinstance(item, Retry):
        return retry_message(item.milliseconds)
    return sse_message(item.payload, event=item.event)  # a Notice


def retry_message(milliseconds: int) -> bytes:
    """The reconnection time a client should wait before it comes back (SSE's ``retry:`` field)."""
    return b"retry: %d\n\n" % milliseconds


def event_message(event: StreamEvent, resume_token: Callable[[TopicCursor], bytes]) -> bytes:
    """One event of the run as an SSE message: its cursor sealed into ``id:``, its payload as stored."""
    cursor, payload = event.cursor, event.payload
    if cursor is None:
        return sse_message(payload)
    if b"\n" in payload:
        return sse_message(payload, event_id=resume_token(cursor))
    return b"id: %b\ndata: %b\n\n" % (resume_token(cursor), payload)


class SseFramer:
    """The SSE bytes of one response's items, its events' cursors sealed by ``sealer`` (a
    :class:`~api.services.delivery.Framer` for the shared writer)."""

    __slots__ = ("binding", "seal", "since")

    ping = PING

    def __init__(self, sealer: StreamSealer, *, since: float = 0.0) -> None:
        #: Seals a cursor into the bytes of an ``id:``.
        self.seal = sealer.seal_bytes
        self.since = since
        self.binding = sealer.binding

    def event(self, event: StreamEvent) -> bytes:
        return event_message(event, self.seal)

    def item(self, item: StreamItem) -> bytes:
        return sse_chunk(item, self.seal, self.since)

    def message(self, payload: bytes) -> bytes:
        return sse_message(payload)

    def retry(self, milliseconds: int) -> bytes:
        return retry_message(milliseconds)

    @staticmethod
    def wire(data: bytes, chunked: bool) -> bytes:
        return b"%X\r\n%b\r\n" % (len(data), data) if chunked else data
