"""Server-sent events wire format: ``id:`` (optional) and ``data:`` lines, pings as ``event: ping``."""

from __future__ import annotations

import json
from typing import Any

PING = "event: ping\n\n"


def sse_event(data: Any, event_id: str | None = None, event: str | None = None) -> str:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}\n")
    if event is not None:
        lines.append(f"event: {event}\n")
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    # A data field may not contain a newline; JSON produced here never does, but stay correct anyway.
    lines.extend(f"data: {line}\n" for line in text.split("\n"))
    return "".join(lines) + "\n"


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
