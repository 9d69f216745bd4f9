"""Reading a topic by ordinal: catch-up reads, and waits for the next records (long-poll and SSE).

Subscriptions resume from cursors; the gateway addresses records by ordinal, so it builds the cursor
after an ordinal with ``admin.cursor_after``. A topic's ordinals are dense (the library's driver
contract), so a subscription after ordinal ``n`` delivers ``n + 1``, ``n + 2``, ... or fails with
``CursorUnavailableError``: only the first record's ordinal is read from its cursor
(``admin.cursor_position``, which decodes it), as a check, and the rest are counted. Each record keeps
its cursor, whose digest (the history up to it) the offset after it carries; it is decoded only for
the offsets a response names. A reader that resumes from an offset with a digest passes it on, so that
a store holding another history there refuses it (``history_diverged``, a 410).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Generator, Iterator

from api.core.durable_stream import (
    CLOSED,
    Closed,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamSubscription,
    TopicCursor,
)

from .errors import gone
from .framing import unframe

__all__ = ["Record", "RecordStream", "TopicReader", "cursor_gone_message"]


def cursor_gone_message(error: CursorUnavailableError) -> str:
    """The 410's text for an offset the store cannot resume from."""
    if error.reason == "history_diverged":
        return f"the stream no longer holds the record this offset follows (history_diverged): {error}"
    return f"offset is no longer retained ({error.reason})"


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    ordinal: int
    payload: bytes
    #: The write's tag (:mod:`.framing`), for the records of a framed stream that have one.
    tag: bytes | None = None
    #: The record's cursor (its digest names the history up to it: see ``digest_of``).
    cursor: TopicCursor | None = None


class RecordStream:
    """The records of one entered subscription, with their ordinals."""

    def __init__(
        self,
        backend: DurableStreamBackend,
        topic: str,
        subscription: DurableStreamSubscription,
        after: int,
        framed: bool,
    ) -> None:
        self._backend = backend
        self._topic = topic
        self._subscription = subscription
        self._next = after + 1
        self._checked = False
        self._framed = framed

    def receive(self, timeout: float) -> Record | None:
        """The next record, or ``None`` at the timeout or once a sealed topic's records are all read."""
        received = self.poll(timeout)
        return None if received is CLOSED else received

    def poll(self, timeout: float) -> Record | Closed | None:
        """The next record, ``None`` at the timeout, :data:`CLOSED` when the subscription has ended.

        It ends after the last record of a sealed topic, or when it was closed (with its backend).
        """
        try:
            received = self._subscription.receive(timeout=timeout)
        except CursorUnavailableError as exc:
            raise gone(cursor_gone_message(exc)) from exc
        if received is None or received is CLOSED:
            return received
        ordinal = self._next
        if not self._checked:
            self._checked = True
            ordinal = self._backend.admin.cursor_position(self._topic, received.cursor).ordinal
        self._next = ordinal + 1
        if not self._framed:
            return Record(ordinal, received.payload, None, received.cursor)
        payload, tag = unframe(received.payload)
        return Record(ordinal, payload, tag, received.cursor)


class TopicReader:
    """Records of one topic incarnation after an ordinal."""

    def __init__(self, backend: DurableStreamBackend, topic: str, epoch: str, *, framed: bool = False) -> None:
        self._backend = backend
        self._topic = topic
        self._epoch = epoch
        self._framed = framed

    def digest_of(self, record: Record) -> str:
        """The digest of the history up to ``record`` (``""`` when the store did not say)."""
        if record.cursor is None:
            return ""
        return self._backend.admin.cursor_position(self._topic, record.cursor).digest

    @contextlib.contextmanager
    def open(self, after: int, digest: str = "") -> Iterator[RecordStream]:
        """The records from just after ``after`` (the record named by ``digest``, when given); 410 when
        that is no longer retained, or the store holds another record there."""
        cursor = self._backend.admin.cursor_after(self._topic, self._epoch, after, digest)
        subscription = self._backend.topic(self._topic).subscribe_from_cursor(cursor)
        try:
            try:
                subscription.__enter__()
            except CursorUnavailableError as exc:
                raise gone(cursor_gone_message(exc)) from exc
            yield RecordStream(self._backend, self._topic, subscription, after, self._framed)
        finally:
            subscription.close()

    def read(self, after: int, until: int, max_bytes: int, timeout: float, digest: str = "") -> list[Record]:
        """Records ``after < ordinal <= until``, stopping early once ``max_bytes`` are collected."""
        records: list[Record] = []
        size = 0
        with contextlib.closing(self.scan(after, until, timeout, digest)) as scanned:
            for record in scanned:
                records.append(record)
                size += len(record.payload)
                if size >= max_bytes:
                    break
        return records

    def scan(self, after: int, until: int, timeout: float, digest: str = "") -> Generator[Record, None, None]:
        """Records ``after < ordinal <= until`` one at a time (fewer if ``timeout`` passes first).

        Close the generator when stopping early: that closes its subscription.
        """
        if until <= after:
            return
        deadline = time.monotonic() + timeout
        with self.open(after, digest) as records:
            while (remaining := deadline - time.monotonic()) > 0:
                record = records.receive(remaining)
                if record is None:
                    return
                yield record
                if record.ordinal >= until:
                    return
