"""The one encoding of a workflow event: the bytes stored on its topic are the bytes clients receive.

Every writer (the worker's attempt, the repair of a run's end, the API's own messages and the
events it builds from a run row) encodes with :func:`encode_event`, and nothing re-encodes a stored
payload on its way to a client: the SSE ``data:`` line carries it as stored. Compact JSON, ASCII
only (``\\uXXXX`` escapes), so a payload never contains a newline and is valid UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["encode_event", "event_name"]


def encode_event(event: Mapping[str, Any]) -> bytes:
    """``{"event": …, …}`` as stored and sent: compact JSON, keys in the event's own order."""
    return json.dumps(event, separators=(",", ":")).encode()


def event_name(payload: bytes) -> str | None:
    """The ``event`` member of a stored payload, or ``None`` if it is not an event object.

    Decodes the payload only to look inside; the payload itself is what goes on.
    """
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    name = event.get("event") if isinstance(event, dict) else None
    return name if isinstance(name, str) else None
