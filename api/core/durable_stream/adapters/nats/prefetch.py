"""Messages the server has just stored on watched subjects, for readers at the live tail.

The stream republishes every stored message (``republish``: after it is stored, never a publish the
compare-and-set refused) on ``_DSLIVE.<stream>.<token>`` with its sequence and the sequence of the
subject's previous message (``Nats-Last-Sequence``). The change feed subscribes to those subjects for
watched topics and puts each message here, keyed by its predecessor's sequence; a local append or
seal puts its own message as soon as it is acknowledged. A reader whose position is that predecessor
gets the message without a round trip, from its own thread: it is exactly what a read from the
server would have returned first when the message was stored (sequences only grow within a stream,
and an incarnation's ordinals are dense). The subscription still checks the epoch and the ordinal.
A reader already at the newest message seen (woken again for the record it has just taken) is told
that nothing follows, also without a read, for at most ``lifetime`` after that message arrived: a
later message wakes it again, and a change the feed's head check finds unseen forgets the newest.

What is never handed out, so that gaps stay exact: messages older than ``lifetime`` (at most 1 s, and
a quarter of ``max_age_seconds``), a stretch of which ``max_records`` would already have removed some
given the newest message seen, and anything of a topic trimmed or deleted since (by this backend
object, or by another one, whose trim and delete announce themselves on the same live subject).
Markers other than the seal end a chain: the reader asks the server.
"""

from __future__ import annotations

import collections
import time

from ..._driver import Batch, Position, StoredRecord, TopicHead
from .loop import raw_lock
from .messages import KIND_SEALED, StreamMessage

__all__ = ["LivePrefetch"]

#: Messages kept per watched subject (the newest): enough for a burst between two reads.
_PER_SUBJECT = 64

#: ``(message, its record or None for a marker, monotonic time it arrived)``.
_Entry = tuple[StreamMessage, StoredRecord | None, float]


class _View:
    __slots__ = ("by_previous", "floor", "live", "newest", "newest_at")

    def __init__(self, floor: int = 0, live: bool = False) -> None:
        self.by_previous: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self.newest: StreamMessage | None = None
        self.newest_at = 0.0
        # Messages up to this sequence arrived before a purge was seen: a late copy is not taken.
        self.floor = floor
        # The feed's subscription to the republished messages is in place: every later message of
        # the subject reaches this view (or the head check notices it was lost).
        self.live = live


class LivePrefetch:
    """Per watched subject, the newest stored messages by predecessor; thread-safe (a raw lock)."""

    def __init__(self, *, max_records: int, max_age_seconds: float | None) -> None:
        self._max_records = max_records
        self._lifetime = 1.0 if max_age_seconds is None else min(1.0, max_age_seconds / 4)
        self._views: dict[str, _View] = {}
        self._lock = raw_lock()

    def watch(self, subject: str) -> None:
        with self._lock:
            self._views.setdefault(subject, _View())

    def unwatch(self, subject: str) -> None:
        with self._lock:
            self._views.pop(subject, None)

    def clear(self) -> None:
        """Forget every message (a reconnect: the server may have lost them)."""
        with self._lock:
            for subject in self._views:
                self._views[subject] = _View()

    def drop(self, subject: str) -> None:
        """Forget the subject's messages (it was trimmed or deleted), and late copies of them."""
        with self._lock:
            view = self._views.get(subject)
            if view is not None:
                newest = view.newest
                self._views[subject] = _View(max(view.floor, 0 if newest is None else newest.seq), view.live)

    def put(self, subject: str, previous: int, message: StreamMessage) -> None:
        """``message`` was stored right after the subject's message ``previous`` (0: it is the first)."""
        with self._lock:
            view = self._views.get(subject)
            if view is None or message.seq <= view.floor:
                return
            known = view.by_previous.get(previous)
            if known is not None and known[0].seq == message.seq:
                return  # the republished copy of a local append (or the other way round)
            record = (
                StoredRecord(message.ordinal, str(message.seq), message.payload, message.digest)
                if message.is_record
                else None
            )
            view.by_previous[previous] = (message, record, time.monotonic())
            while len(view.by_previous) > _PER_SUBJECT:
                view.by_previous.popitem(last=False)
            newest = view.newest
            if newest is None or message.seq > newest.seq or message.epoch != newest.epoch:
                view.newest, view.newest_at = message, time.monotonic()

    def live(self, subject: str) -> None:
        """The feed's subscription to the subject's republished messages is in place."""
        with self._lock:
            view = self._views.get(subject)
            if view is not None:
                view.live = True

    def stale(self, subject: str) -> None:
        """The subject changed in a way not seen here: its newest message is no longer known."""
        with self._lock:
            view = self._views.get(subject)
            if view is not None:
                view.newest = None

    def lookup(self, subject: str, after: Position, limit: int) -> Batch | None:
        """The records after ``after`` (and the seal, if it follows them) without asking the server,
        or ``None`` when they are not all known here."""
        if not after.native or limit <= 0:
            return None
        try:
            seq = int(after.native)
        except ValueError:
            return None
        now = time.monotonic()
        records: list[StoredRecord] = []
        seal: StreamMessage | None = None
        with self._lock:
            view = self._views.get(subject)
            if view is None or not view.by_previous:
                return None
            newest = view.newest
            if (
                newest is not None
                and view.live
                and newest.seq == seq
                and newest.ordinal == after.ordinal
                and now - view.newest_at <= self._lifetime
                and seq not in view.by_previous
            ):
                # The reader is at the newest message seen (its wake-up was for the record it has
                # just taken): nothing new, without a read. Anything stored later wakes it again.
                sealed = newest.kind == KIND_SEALED
                head = TopicHead(newest.epoch, after.ordinal + 1, after.ordinal, sealed, str(seq), newest.digest)
                return Batch(head=head, records=())
            epoch = ""
            while len(records) < limit:
                entry = view.by_previous.get(seq)
                if entry is None or now - entry[2] > self._lifetime:
                    break
                message, record, _ = entry
                if epoch and message.epoch != epoch:
                    return None
                epoch = message.epoch
                ordinal = after.ordinal + len(records)
                if message.kind == KIND_SEALED and message.ordinal == ordinal:
                    seal = message
                    break
                if record is None or message.ordinal != ordinal + 1:
                    break  # another marker, or not this reader's next record: the server decides
                records.append(record)
                seq = message.seq
        if not records and seal is None:
            return None
        if newest is None or newest.epoch != epoch or (records and newest.seq < int(records[-1].native)):
            newest = seal
        last = seal or newest
        if last is None:
            last_ordinal, last_native, sealed = records[-1].ordinal, records[-1].native, False
            last_digest = records[-1].digest
        else:
            last_ordinal, last_native, sealed = last.ordinal, str(last.seq), last.kind == KIND_SEALED
            last_digest = last.digest
        first = records[0].ordinal if records else after.ordinal + 1
        if self._max_records and records:
            # Messages from the first record on that the server holds at least (a seal counts as one).
            held = last_ordinal - first + 1 + (1 if sealed else 0)
            if held > self._max_records:
                return None  # the limit may already have removed the first of them
        return Batch(head=TopicHead(epoch, first, last_ordinal, sealed, last_native, last_digest), records=records)

    def size(self, subject: str) -> int:
        """How many messages of ``subject`` are held (tests)."""
        with self._lock:
            view = self._views.get(subject)
            return 0 if view is None else len(view.by_previous)
