"""Server-sent events on the wire: ``id:`` (optional), ``event:`` (optional) and ``data:`` lines.

The HTTP edge of the event streams. :func:`sse_messages` frames the domain items a service yields:
a run's event goes out as ``id: <resume token>`` + ``data: <payload as stored>``, a notice as
``event: <name>`` + ``data: …``, a ping as ``event: ping``.

Messages are built as bytes straight from the stored payload (no decode and re-encode), and the
events a service yields back to back before a :data:`~api.core.app.apps.message_generator.FLUSH`
go out as one chunk: one write to the client's socket for all the events that were ready at once.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from api.core.app.apps.message_generator import Flush, Notice, Ping, StreamItem
from api.core.durable_stream import TopicCursor

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


def sse_messages(
    items: Generator[StreamItem, None, None], *, resume_token: Callable[[TopicCursor], bytes]
) -> Generator[bytes, None, None]:
    """The SSE bytes of ``items``; each event's cursor becomes its ``id:`` through ``resume_token``.

    Events are held until a flush, a ping, a notice or the end, and sent together as one chunk.
    Closing this generator closes ``items`` (and so the subscription behind them).
    """
    held: list[bytes] = []
    try:
        for item in items:
            if isinstance(item, Flush):
                if held:
                    yield b"".join(held) if len(held) > 1 else held[0]
                    held.clear()
            elif isinstance(item, Ping):
                held.append(PING)
                yield b"".join(held) if len(held) > 1 else held[0]
                held.clear()
            elif isinstance(item, Notice):
                held.append(sse_message(item.payload, event=item.event))
                yield b"".join(held) if len(held) > 1 else held[0]
                held.clear()
            else:
                cursor = item.cursor
                payload = item.payload
                if cursor is None:
                    held.append(sse_message(payload))
                elif b"\n" in payload:
                    held.append(sse_message(payload, event_id=resume_token(cursor)))
                else:
                    held.append(b"id: %b\ndata: %b\n\n" % (resume_token(cursor), payload))
        if held:
            yield b"".join(held) if len(held) > 1 else held[0]
    finally:
        items.close()
