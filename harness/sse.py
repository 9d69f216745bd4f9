"""A small SSE parser for tests: turns a byte stream into events (id, event, data)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from typing import Any


@dataclasses.dataclass
class SseMessage:
    id: str | None
    event: str | None
    data: str

    @property
    def json(self) -> Any:
        return json.loads(self.data)

    @property
    def is_ping(self) -> bool:
        return self.event == "ping"


def parse_sse(chunks: Iterable[bytes | str]) -> Iterator[SseMessage]:
    buffer = ""
    for chunk in chunks:
        buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            message = _parse_block(block)
            if message is not None:
                yield message


def _parse_block(block: str) -> SseMessage | None:
    event_id, event, data = None, None, []
    for line in block.split("\n"):
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            event_id = value
        elif field == "event":
            event = value
        elif field == "data":
            data.append(value)
    if event_id is None and event is None and not data:
        return None
    return SseMessage(event_id, event, "\n".join(data))
