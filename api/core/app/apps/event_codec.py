"""The one encoding of a workflow event: the bytes stored on its topic are the bytes clients receive,
after an envelope of fixed size.

Every writer (the worker's attempt, the repair of a run's end, the API's own messages and the
events it builds from a run row) encodes with :func:`encode_event`, and nothing re-encodes a stored
payload on its way to a client: the SSE ``data:`` line carries it as stored. Compact JSON, ASCII
only (``\\uXXXX`` escapes), so a payload never contains a newline and is valid UTF-8.

**The envelope.** Writers store :func:`stamped` payloads: a record separator (``\\x1e``, which no
JSON text begins with) and the writer's clock at the append (``time.time()``, 17 ASCII characters),
then the payload. Readers (the event transports) cut the envelope off with one slice
(:func:`unstamped`) and keep the stored bytes beside the payload, so the HTTP edge can read the
stamp (:func:`stamp_of`) once per write for the delivery-lag metric; clients never see it. A stored
payload without an envelope (written before it existed) is the payload itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["STAMP_MARK", "STAMP_SIZE", "encode_event", "event_name", "stamp_of", "stamped", "unstamped"]

#: The first byte of a stored payload with an envelope, and the envelope's size.
STAMP_MARK = b"\x1e"
STAMP_SIZE = 18


def stamped(payload: bytes) -> bytes:
    """``payload`` as a writer stores it: the envelope with the time of this call, then the payload."""
    return b"\x1e%017.6f" % time.time() + payload


def unstamped(stored: bytes) -> bytes:
    """The payload of a stored record (the stored bytes themselves if they have no envelope)."""
    return stored[STAMP_SIZE:] if stored[:1] == STAMP_MARK else stored


def stamp_of(stored: bytes) -> float | None:
    """The writer's clock in a stored record's envelope, or ``None`` if it has none."""
    if stored[:1] != STAMP_MARK:
        return None
    try:
        return float(stored[1:STAMP_SIZE])
    except ValueError:
        return None


def encode_event(event: Mapping[str, Any]) -> bytes:
    """``{"event": …, …}`` as stored and sent: compact JSON, keys in the event's own order."""
    return json.dumps(event, separators=(",", ":")).encode()


#: What :func:`encode_event` writes first for every event made by ``make_event`` (the ``event``
#: member comes first, as a compact JSON string).
_PREFIX = b'{"event":"'
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
#: What may follow the name's closing quote: another member or the end of the object.
_AFTER_NAME = frozenset(b",}")


def event_name(payload: bytes) -> str | None:
    """The ``event`` member of a stored payload, or ``None`` if it is not an event object.

    Only looks inside; the payload itself is what goes on. Every stored payload was written by
    :func:`encode_event`, which puts ``"event"`` first for every event (compact JSON, ASCII only),
    so the name is read from that prefix when it is a string without escapes followed by another
    member or the end of the object; any other payload is decoded as JSON.
    """
    if payload[:10] == _PREFIX:
        end = payload.find(_QUOTE, 10)
        if end > 10 and end + 1 < len(payload) and payload[end + 1] in _AFTER_NAME:
            name = payload[10:end]
            if _BACKSLASH not in name and name.isascii():
                return name.decode("ascii")
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    value = event.get("event") if isinstance(event, dict) else None
    return value if isinstance(value, str) else None
