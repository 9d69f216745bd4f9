"""Reading a topic by ordinal: catch-up reads, and waits for the next records (long-poll and SSE).

Subscriptions resume from cursors; the gateway addresses records by ordinal, so it builds the cursor
after an ordinal with ``admin.cursor_after`` and learns each record's ordinal from its cursor with
``admin.cursor_position``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamSubscription,
)

from .errors import gone

__all__ = ["Record", "TopicReader"]


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    ordinal: int
    payload: bytes


class TopicReader:
    """Records of one topic incarnation after an ordinal."""

    def __init__(self, backend: DurableStreamBackend, topic: str, epoch: str) -> None:
        self._backend = backend
        self._topic = topic
        self._epoch = epoch

    @contextlib.contextmanager
    def open(self, after: int) -> Iterator[DurableStreamSubscription]:
        """An entered subscription from just after ``after``; 410 when that is no longer retained."""
        cursor = self._backend.admin.cursor_after(self._topic, self._epoch, after)
        subscription = self._backend.topic(self._topic).subscribe_from_cursor(cursor)
        try:
            try:
                subscription.__enter__()
            except CursorUnavailableError as exc:
                raise gone(f"offset is no longer retained ({exc.reason})") from exc
            yield subscription
        finally:
            subscription.close()

    def read(self, after: int, until: int, max_bytes: int, timeout: float) -> list[Record]:
        """Records ``after < ordinal <= until``, stopping early once ``max_bytes`` are collected."""
        if until <= after:
            return []
        records: list[Record] = []
        size = 0
        deadline = time.monotonic() + timeout
        with self.open(after) as subscription:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                record = self.receive(subscription, remaining)
                if record is None:
                    break
                records.append(record)
                size += len(record.payload)
                if record.ordinal >= until or size >= max_bytes:
                    break
        return records

    def receive(self, subscription: DurableStreamSubscription, timeout: float) -> Record | None:
        """The next record, or ``None`` at the timeout or once a sealed topic's records are all read."""
        try:
            received = subscription.receive(timeout=timeout)
        except CursorUnavailableError as exc:
            raise gone(f"offset is no longer retained ({exc.reason})") from exc
        if received is None or received is CLOSED:
            return None
        position = self._backend.admin.cursor_position(self._topic, received.cursor)
        return Record(position.ordinal, received.payload)
