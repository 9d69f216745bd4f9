"""The one subscription implementation every adapter shares.

Delivery is pull-based: a subscription asks its driver for the next batch only when its buffer is
empty, so records wait in the backend and a slow reader costs nothing but its position. Every
batch is checked against the ordinal the subscription expects next, which is what makes gap
detection exact on every backend.
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
import types
from collections.abc import Callable, Sequence
from typing import Self

from ._contract import (
    CLOSED,
    Closed,
    CursorUnavailableError,
    DurableStreamError,
    DurableStreamRecord,
    DurableStreamSubscription,
    DurableStreamUnavailableError,
)
from ._cooperative import new_wake
from ._cursor import CursorCodec
from ._driver import Batch, Position, StoredRecord
from ._engine import Engine
from ._observer import REASON_DIVERGED, REASON_EPOCH, REASON_TRIMMED

__all__ = ["START_BEGINNING", "START_CURSOR", "START_TAIL", "Subscription"]

#: Where a subscription starts, as its observer hears it.
START_BEGINNING, START_CURSOR, START_TAIL = "beginning", "cursor", "tail"

#: Guards every subscription's state transitions (enter, close). They are rare and short, and one
#: lock object per subscription would be one more long-lived object for the cyclic GC to scan
#: (two under gevent) in a worker holding thousands of streams.
_TRANSITIONS = threading.Lock()


def _reset_after_fork() -> None:
    # A fork while another thread held the lock would leave it held forever in the child, and
    # with it every subscription the child opens.
    global _TRANSITIONS
    _TRANSITIONS = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _notify(hook: Callable[..., None], *args: object) -> None:
    """Call an observer's hook; its failure is its own (the caller's operation goes on)."""
    with contextlib.suppress(Exception):
        hook(*args)


class _State(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class Subscription(DurableStreamSubscription):
    """A subscription whose starting boundary (epoch and position) was fixed at creation."""

    def __init__(
        self,
        engine: Engine,
        topic: str,
        codec: CursorCodec,
        epoch: str,
        start: Position,
        *,
        kind: str = START_CURSOR,
    ) -> None:
        self._engine = engine
        if engine.observer is not None:  # only an observed subscription spends an attribute on it
            self._kind = kind
        self._topic = topic
        self._codec = codec
        self._epoch = epoch
        # The position as two attributes, not a Position: one object per delivery that lives until
        # the next one would be promoted by the cyclic GC at every subscription.
        self._ordinal, self._native, self._digest = start.ordinal, start.native, start.digest
        # The records of the last read not yet returned: the batch itself (subscriptions at the
        # same position share one) and the index of the next record, not a copy in a buffer. The
        # batch is () once its last record is taken, so it is truthy exactly while records remain.
        self._batch: Sequence[StoredRecord] = ()
        self._next = 0
        self._sealed_at: int | None = None
        self._state = _State.NEW
        self._wake = new_wake()
        self._seen_version: int | None = None
        self._last_read = 0.0

    def __repr__(self) -> str:
        return f"<Subscription topic={self._topic!r} state={self._state.value}>"

    def __enter__(self) -> Self:
        with _TRANSITIONS:
            if self._state is not _State.NEW:
                raise DurableStreamUnavailableError("a subscription can be entered only once")
            self._state = _State.OPEN
        observer = self._engine.observer
        if observer is not None:
            _notify(observer.subscription_opened, self._engine.name)
        try:
            self._engine.attach(self)
            self._engine.notifier.register(self._topic, self._wake)
            self._wake.clear()
            self._seen_version = None
            start = self._ordinal
            last = self._fill()
        except BaseException:
            self.close()
            raise
        if observer is not None:
            _notify(observer.subscription_started, self._engine.name, self._kind, max(last - start, 0))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> bool | None:
        self.close()
        return None

    def close(self) -> None:
        with _TRANSITIONS:
            if self._state is _State.CLOSED:
                return
            was_open = self._state is _State.OPEN
            self._state = _State.CLOSED
        self._wake.set()
        self._batch, self._next = (), 0
        if was_open:
            try:
                self._engine.notifier.unregister(self._topic, self._wake)
                self._engine.detach(self)
            except Exception:  # close() must never raise; nothing is left to release here
                pass
            observer = self._engine.observer
            if observer is not None:
                _notify(observer.subscription_closed, self._engine.name)

    def receive(self, timeout: float = 0.1) -> DurableStreamRecord | Closed | None:
        # Fast path: a buffered record needs no clock, no notifier and no driver.
        if self._batch and self._state is _State.OPEN:
            stored = self._take()
            if stored is not None:
                return self._record(stored)
        if self._state is _State.NEW:
            self.close()
            raise DurableStreamUnavailableError("receive() called on a subscription that was never entered")
        deadline = time.monotonic() + max(timeout, 0.0)
        notifier = self._engine.notifier
        reread_interval = self._engine.driver.reread_interval
        while True:
            if self._state is _State.CLOSED:
                return CLOSED
            stored = self._take()
            if stored is not None:
                return self._record(stored)
            if self._sealed_at is not None and self._ordinal >= self._sealed_at:
                self.close()
                return CLOSED
            now = time.monotonic()
            announced = notifier.version(self._topic) != self._seen_version
            if not announced and now - self._last_read >= reread_interval:
                # The last-resort re-read: one per topic and interval stands for every subscription
                # at the position that read found to be the end.
                self._last_read = notifier.last_resort(
                    self._topic, self._epoch, self._ordinal, self._last_read, now, reread_interval
                )
            if announced or now - self._last_read >= reread_interval:
                # Records found by a read no wake-up asked for were missed by the topic's other
                # subscriptions too (a wake-up was lost): they are told.
                missed = not announced and self._seen_version is not None
                self._wake.clear()
                try:
                    self._fill()
                except BaseException:
                    # Closed meanwhile (by another thread, or with its backend, whose connection
                    # may then fail the read in flight): close() wins, as for a blocked receive().
                    closed_meanwhile = self._closed()
                    self.close()
                    if closed_meanwhile:
                        return CLOSED
                    raise
                if self._batch or self._sealed_at is not None:
                    if missed:
                        notifier.notify(self._topic)
                    continue
                now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                return None
            notifier.wait(self._wake, min(remaining, reread_interval))

    def _closed(self) -> bool:
        # A method, not an inline check: the state changes under the caller's feet (another thread).
        return self._state is _State.CLOSED

    def _take(self) -> StoredRecord | None:
        """The next buffered record, or ``None``; the batch is let go with its last record."""
        batch, index = self._batch, self._next  # one snapshot: close() may clear both meanwhile
        if index >= len(batch):
            return None
        if index + 1 == len(batch):
            self._batch, self._next = (), 0
        else:
            self._next = index + 1
        return batch[index]

    def _record(self, stored: StoredRecord) -> DurableStreamRecord:
        codec = self._codec
        shared = stored.delivered
        # Subscriptions of one topic that share a batch share its records' cursors too.
        if shared is not None and shared[0] == codec.digest and shared[1] == self._epoch:
            return shared[2]
        record = DurableStreamRecord(
            stored.payload, codec.encode(self._epoch, stored.ordinal, stored.native, stored.digest)
        )
        stored.delivered = (codec.digest, self._epoch, record)
        return record

    def _fill(self) -> int:
        """Read the next batch (the last one is used up), validating it against the expected ordinal.

        Returns the topic's last ordinal as of the read.
        """
        engine = self._engine
        version = engine.notifier.version(self._topic)
        started = time.monotonic()
        try:
            after = Position(self._ordinal, self._native, self._digest)
            batch = engine.driver.read(self._topic, after, engine.buffer_size)
        except DurableStreamError as exc:
            engine.observe_error(exc)
            raise
        except Exception as exc:  # an adapter bug must still surface as a contract error
            error = DurableStreamUnavailableError(f"read failed: {exc!r}")
            engine.observe_error(error)
            raise error from exc
        self._last_read = time.monotonic()
        if engine.observer is not None:
            _notify(engine.observer.records_read, engine.name, len(batch.records))
        try:
            caught_up = self._accept(batch)
        except DurableStreamError as exc:
            engine.observe_error(exc)
            raise
        # Only a read that reached the head may be trusted until the next notification.
        self._seen_version = version if caught_up else None
        if caught_up and batch.head is not None:
            engine.notifier.confirm(self._topic, self._epoch, batch.head.last, started)
        return batch.head.last if batch.head is not None else self._ordinal

    def _accept(self, batch: Batch) -> bool:
        """Buffer a validated batch; return whether it reached the topic's last record.

        The batch must continue the history this subscription has delivered (or was started after):
        the same incarnation, the next ordinal, and a first record whose digest is the chain of the
        subscription's own digest and its payload (or, at the head, the head's last digest equal to
        it). A store that lost records the reader holds, or holds other records at those ordinals,
        fails that check: ``history_diverged``, never another history passed off as this one.
        """
        head = batch.head
        position = self._ordinal
        topic = self._topic
        if head is None or head.epoch != self._epoch:
            raise CursorUnavailableError(
                f"topic {topic!r} was deleted, expired or re-created after this position was fixed",
                reason=REASON_EPOCH,
            )
        expected = position + 1
        if head.last < position:
            raise CursorUnavailableError(
                f"topic {topic!r} ends at record {head.last} but this reader has records up to {position}: "
                f"the store no longer has records {head.last + 1}..{position} (a failover to a replica behind?)",
                reason=REASON_DIVERGED,
            )
        records = batch.records
        if records:
            first = records[0]
            if first.ordinal < expected:
                # Read after this position's native id, the store returned earlier ordinals: its history
                # after record first.ordinal - 1 is not the one this reader followed.
                raise CursorUnavailableError(
                    f"topic {topic!r} has other records than this reader from record {first.ordinal} on "
                    f"(the reader has records up to {position})",
                    reason=REASON_DIVERGED,
                )
            if first.ordinal != expected:
                raise CursorUnavailableError(
                    f"records {expected}..{first.ordinal - 1} of topic {topic!r} were removed by retention "
                    f"before this reader (at record {position}) read them",
                    reason=REASON_TRIMMED,
                )
            digest = self._digest
            if digest and first.digest and first.follows != digest:
                if self._engine.driver.chain(digest, first.payload) != first.digest:
                    raise CursorUnavailableError(
                        f"record {position} of topic {topic!r} is not the one this reader received "
                        f"(record {expected} does not follow it): the store's history diverged",
                        reason=REASON_DIVERGED,
                    )
                first.follows = digest
            for offset, record in enumerate(records):
                if record.ordinal != expected + offset:
                    raise DurableStreamUnavailableError(f"backend returned a non-contiguous batch for {topic!r}")
            self._batch, self._next = records, 0
            last = records[-1]
            self._ordinal, self._native, self._digest = last.ordinal, last.native, last.digest
        elif head.first > expected:
            raise CursorUnavailableError(
                f"records {expected}..{head.first - 1} of topic {topic!r} were removed by retention "
                f"before this reader (at record {position}) read them",
                reason=REASON_TRIMMED,
            )
        elif head.last > position:
            raise DurableStreamUnavailableError(f"backend returned no records after {position} of {topic!r}")
        elif self._digest and head.last_digest and head.last_digest != self._digest:
            raise CursorUnavailableError(
                f"record {position}, the last of topic {topic!r}, is not the one this reader received: "
                "the store's history diverged",
                reason=REASON_DIVERGED,
            )
        if head.sealed:
            self._sealed_at = head.last
        return self._ordinal >= head.last
