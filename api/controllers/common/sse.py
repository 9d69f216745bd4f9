"""Server-sent events on the wire: ``id:`` (optional), ``event:`` (optional) and ``data:`` lines.

The HTTP edge of the event streams. :func:`sse_messages` frames the domain items a service yields:
a run's event goes out as ``id: <resume token>`` + ``data: <payload as stored>``, a notice as
``event: <name>`` + ``data: …``, a ping as ``event: ping``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from api.core.app.apps.message_generator import Notice, Ping, StreamItem
from api.core.durable_stream import TopicCursor

PING = "event: ping\n\n"

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_message(data: str, event_id: str | None = None, event: str | None = None) -> str:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}\n")
    if event is not None:
        lines.append(f"event: {event}\n")
    # A data field may not contain a newline; stored events never do, but stay correct anyway.
    lines.extend(f"data: {line}\n" for line in data.split("\n"))
    return "".join(lines) + "\n"


def sse_messages(
    items: Generator[StreamItem, None, None], *, resume_token: Callable[[TopicCursor], str]
) -> Generator[str, None, None]:
    """The SSE text of ``items``; each event's cursor becomes its ``id:`` through ``resume_token``.

    Closing this generator closes ``items`` (and so the subscription behind them).
    """
    try:
        for item in items:
            if isinstance(item, Ping):
                yield PING
            elif isinstance(item, Notice):
                yield sse_message(item.payload.decode(), event=item.event)
            else:
                event_id = None if item.cursor is None else resume_token(item.cursor)
                yield sse_message(item.payload.decode(), event_id=event_id)
    finally:
        items.close()
