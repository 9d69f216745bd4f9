"""Topics on one JetStream stream: dense ordinals, epochs, seal and trims (loop-side, asyncio).

Only :meth:`TopicStore.append_direct` runs in the caller's thread (see :mod:`.publisher`); the
remembered tails it shares with the loop are behind a lock.

Every change of a topic's subject is a compare-and-set publish: the adapter reads the subject's last
message (its sequence, the ordinal and epoch in its headers) and publishes the next message with
``Nats-Expected-Last-Subject-Sequence`` set to that sequence, so two writers (threads, processes,
hosts) can never both append ordinal ``n``: the loser re-reads and retries. Within one backend object
appends to one topic are serialised by an asyncio lock and remember the last acknowledged sequence,
so an uncontended append is a single round trip.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import secrets
import weakref
from collections.abc import Callable, Iterator

from ..._contract import DurableStreamUnavailableError, TopicSealedError
from ..._digest import GENESIS, sha1_chain
from ..._driver import Appended, Batch, Position, Refused, StoredRecord, TopicHead
from .cache import ReadCache
from .jetstream import JetStream, WrongSequenceError, acknowledged_sequence
from .locate import locate
from .loop import raw_lock
from .messages import KIND_CREATED, KIND_RECORD, KIND_SEALED, KIND_TRIMMED, StreamMessage
from .prefetch import LivePrefetch
from .publisher import DirectPublisher

__all__ = ["TopicStore", "subject_token"]

#: Compare-and-set attempts of one append before giving up (each lost attempt means another writer won).
_MAX_ATTEMPTS = 1000
#: Topics whose last acknowledged position one backend object remembers.
_TAIL_CACHE = 4096
#: Re-reads of one batch whose records and head disagree (a topic re-created meanwhile, a follower
#: behind the leader).
_READ_ATTEMPTS = 25


def subject_token(topic: str) -> str:
    """The subject token of a topic name: base32 (lower case, unpadded) of its UTF-8 bytes.

    Injective, and only ``a-z2-7``: any name maps to one valid token, never to a wildcard or a
    separator.
    """
    return base64.b32encode(topic.encode("utf-8", "surrogatepass")).decode("ascii").rstrip("=").lower()


def _new_epoch() -> str:
    return secrets.token_hex(8)


def _records(messages: list[StreamMessage], after: int) -> list[StoredRecord]:
    return [
        StoredRecord(message.ordinal, str(message.seq), message.payload, message.digest)
        for message in messages
        if message.is_record and message.ordinal > after
    ]


def _passed(message: StreamMessage, after: Position) -> bool:
    """Whether ``message``, stored after the reader's position, belongs before it: another incarnation.

    A record or a "created" marker there must carry a higher ordinal. A trim or seal marker carries
    the last ordinal before it, which may be the reader's own (a topic trimmed to empty right after
    the reader's record, and a follower that has not applied the next record yet).
    """
    if message.is_record or message.kind == KIND_CREATED:
        return message.ordinal <= after.ordinal
    return message.ordinal < after.ordinal


def _at(tail: StreamMessage | None, expect: Position) -> bool:
    """Whether a conditional append's expected head is ``tail`` (no message: position 0)."""
    if tail is None:
        return expect.ordinal == 0
    return tail.ordinal == expect.ordinal and tail.digest == expect.digest


def _headers(ordinal: int, epoch: str, digest: str, kind: str = KIND_RECORD) -> dict[str, str]:
    headers = {"Ds-O": str(ordinal), "Ds-E": epoch, "Ds-H": digest}
    if kind != KIND_RECORD:
        headers["Ds-K"] = kind
    return headers


class TopicStore:
    """Topic operations of one backend object, run on its event loop."""

    def __init__(self, js: JetStream, subject_prefix: str, prefetch: LivePrefetch) -> None:
        self._js = js
        self._prefix = subject_prefix
        self._prefetch = prefetch
        #: Called on the loop with a topic this backend object has just appended to (the
        #: change feed's wake-up: readers of the topic need not wait for the republished copy).
        self.on_change: Callable[[str], None] | None = None
        self._tails: collections.OrderedDict[str, StreamMessage] = collections.OrderedDict()
        self._tails_lock = raw_lock()
        #: Appends handed to the loop and not finished, by subject: a direct append would race them.
        self._through_loop: collections.Counter[str] = collections.Counter()
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._cache = ReadCache()

    def subject(self, topic: str) -> str:
        return f"{self._prefix}.{subject_token(topic)}"

    def forget(self) -> None:
        """Drop every remembered tail and read (after a reconnect: the server may have lost them)."""
        with self._tails_lock:
            self._tails.clear()
        self._cache.clear()
        self._prefetch.clear()

    def _lock(self, subject: str) -> asyncio.Lock:
        lock = self._locks.get(subject)
        if lock is None:
            lock = self._locks[subject] = asyncio.Lock()
        return lock

    def _remember(self, subject: str, message: StreamMessage) -> None:
        with self._tails_lock:
            known = self._tails.get(subject)
            # Appends from the callers' threads (append_direct) and from the loop may finish in
            # either order; the compare-and-set made the higher sequence the later message.
            if known is not None and known.seq > message.seq:
                return
            self._tails[subject] = message
            self._tails.move_to_end(subject)
            while len(self._tails) > _TAIL_CACHE:
                self._tails.popitem(last=False)

    def _forget_tail(self, subject: str) -> None:
        with self._tails_lock:
            self._tails.pop(subject, None)

    async def _tail(self, subject: str) -> StreamMessage | None:
        with self._tails_lock:
            cached = self._tails.get(subject)
        if cached is not None:
            return cached
        last = await self._js.last(subject)
        if last is not None:
            self._remember(subject, last)
        return last

    async def _publish_next(self, subject: str, payload: bytes, kind: str, tail: StreamMessage | None) -> StreamMessage:
        """Publish after ``tail`` (``None``: as the subject's first message, in a new epoch)."""
        if tail is None:
            epoch, expected, previous = _new_epoch(), 0, GENESIS
            ordinal = 1 if kind == KIND_RECORD else 0
        else:
            epoch, expected, previous = tail.epoch, tail.seq, tail.digest
            ordinal = tail.ordinal + 1 if kind == KIND_RECORD else tail.ordinal
        # A record's digest chains on the history before it; a marker carries that history's digest.
        digest = sha1_chain(previous, payload) if kind == KIND_RECORD else previous
        try:
            seq = await self._js.publish(subject, payload, _headers(ordinal, epoch, digest, kind), expected)
        except WrongSequenceError:
            self._forget_tail(subject)
            raise
        message = StreamMessage(seq, ordinal, epoch, kind, payload, digest)
        self._remember(subject, message)
        # Readers of this backend object at the tail need not wait for the server's republished copy.
        self._prefetch.put(subject, expected, message)
        return message

    def _changed(self, topic: str) -> None:
        callback = self.on_change
        if callback is not None:
            callback(topic)

    @contextlib.contextmanager
    def through_loop(self, topic: str) -> Iterator[None]:
        """Around an append handed to the loop (in the caller's thread): direct appends keep off the topic."""
        subject = self.subject(topic)
        with self._tails_lock:
            self._through_loop[subject] += 1
        try:
            yield
        finally:
            with self._tails_lock:
                self._through_loop[subject] -= 1
                if not self._through_loop[subject]:
                    del self._through_loop[subject]

    def append_direct(
        self, topic: str, payload: bytes, publisher: DirectPublisher, expect: Position | None = None
    ) -> Appended | None:
        """Append from the caller's thread or greenlet on ``publisher``; ``None``: use :meth:`append`.

        With ``expect``, only when the remembered tail is that position: the compare-and-set on its
        sequence then makes the condition hold at the server too.

        Only the uncontended case is taken here: a topic whose last message this backend object
        knows (not a seal), and a publisher that is free. Anything else (no known tail, a lost
        compare-and-set, a deleted stream, a publish that could not be sent) is left to the loop,
        which re-reads, retries and creates; nothing has been stored then.

        Raises:
            DurableStreamUnavailableError: JetStream refused the publish.
            OSError: The request was sent and no acknowledgement came (the record may be stored).
            ValueError: The acknowledgement was not JSON.
        """
        subject = self.subject(topic)
        with self._tails_lock:
            tail = self._tails.get(subject)
            if self._through_loop[subject]:
                # Other threads of this process append to the topic through the loop, one after the
                # other on its cached tail: join them rather than lose compare-and-sets to them.
                return None
        if tail is None or tail.kind == KIND_SEALED or (expect is not None and not _at(tail, expect)):
            return None
        ordinal = tail.ordinal + 1
        digest = sha1_chain(tail.digest, payload)
        headers = _headers(ordinal, tail.epoch, digest)
        headers["Nats-Expected-Last-Subject-Sequence"] = str(tail.seq)
        headers["Nats-Expected-Stream"] = self._js.stream
        reply = publisher.publish(subject, headers, payload)
        if isinstance(reply, str):  # UNSENT, or NO_RESPONDERS: the stream is gone
            return None
        try:
            seq = acknowledged_sequence(reply)
        except WrongSequenceError:
            self._forget_tail(subject)
            return None
        if seq is None:
            return None
        message = StreamMessage(seq, ordinal, tail.epoch, KIND_RECORD, payload, digest)
        self._remember(subject, message)
        self._prefetch.put(subject, tail.seq, message)
        self._changed(topic)
        return Appended(message.epoch, message.ordinal, message.digest)

    # -- driver operations --------------------------------------------------------------------

    async def append(self, topic: str, payload: bytes, expect: Position | None = None) -> Appended | Refused:
        subject = self.subject(topic)
        async with self._lock(subject):
            for _ in range(_MAX_ATTEMPTS):
                tail = await self._tail(subject)
                if expect is not None and not _at(tail, expect):
                    # A remembered tail may be old (another writer appended since): the server decides.
                    self._forget_tail(subject)
                    tail = await self._tail(subject)
                    if not _at(tail, expect):
                        return Refused(None if tail is None else await self._exact_head(subject, tail))
                if tail is not None and tail.kind == KIND_SEALED:
                    raise TopicSealedError(f"topic {topic!r} is sealed")
                try:
                    message = await self._publish_next(subject, payload, KIND_RECORD, tail)
                except WrongSequenceError:
                    continue
                self._changed(topic)
                return Appended(message.epoch, message.ordinal, message.digest)
        raise DurableStreamUnavailableError(f"append to {topic!r} lost {_MAX_ATTEMPTS} races with other writers")

    async def seal(self, topic: str) -> None:
        subject = self.subject(topic)
        async with self._lock(subject):
            for _ in range(_MAX_ATTEMPTS):
                tail = await self._tail(subject)
                if tail is not None and tail.kind == KIND_SEALED:
                    return
                try:
                    await self._publish_next(subject, b"", KIND_SEALED, tail)
                except WrongSequenceError:
                    continue
                return
        raise DurableStreamUnavailableError(f"seal of {topic!r} lost {_MAX_ATTEMPTS} races with other writers")

    async def head(self, topic: str, *, create: bool) -> TopicHead | None:
        subject = self.subject(topic)
        for _ in range(_MAX_ATTEMPTS):
            last = await self._js.last(subject)
            if last is None:
                if not create:
                    return None
                async with self._lock(subject):
                    try:
                        last = await self._publish_next(subject, b"", KIND_CREATED, None)
                    except WrongSequenceError:
                        continue  # another writer created it first
            head = await self._exact_head(subject, last)
            if head is not None:
                return head
        raise DurableStreamUnavailableError(f"the head of {topic!r} kept changing")

    async def _exact_head(self, subject: str, last: StreamMessage) -> TopicHead | None:
        """The head with ``last`` and the first retained message, or ``None`` if they disagree (retry)."""
        first = await self._js.first(subject)
        if first is None or first.seq > last.seq or first.epoch != last.epoch:
            return None
        first_ordinal = first.ordinal if first.is_record else first.ordinal + 1
        return TopicHead(
            epoch=last.epoch,
            first=first_ordinal,
            last=last.ordinal,
            sealed=last.kind == KIND_SEALED,
            last_native=str(last.seq),
            last_digest=last.digest,
        )

    async def read(self, topic: str, after: Position, limit: int) -> Batch:
        subject = self.subject(topic)
        previous: int | None = None
        if after.native:
            try:
                previous = int(after.native)
            except ValueError:
                previous = None  # not a sequence: read from the first message and skip by ordinal
        # A message read after ``previous`` that the reader has passed means another incarnation only
        # when ``previous`` is the reader's own record, not a message found before its position.
        own = previous
        located: StreamMessage | None = None
        js = self._js
        for attempt in range(_READ_ATTEMPTS):
            # The head and what follows are asked for at once (one round trip): the records from the
            # read cache need the first retained message to be trusted, the others a batch. A batch
            # served just before the head's newest message was stored is only shorter; an empty one
            # is read again below.
            first: StreamMessage | None = None
            messages: list[StreamMessage] | None = None
            if previous is None or self._cache.follows(subject, previous):
                last, first = await asyncio.gather(js.last(subject), js.first(subject))
            elif attempt == 0 and js.replicated:
                last, first, messages = await asyncio.gather(
                    js.last(subject), js.first(subject), js.batch(subject, previous + 1, limit)
                )
            elif attempt == 0:
                last, messages = await asyncio.gather(js.last(subject), js.batch(subject, previous + 1, limit))
            else:
                last = await js.last(subject)
            if last is None:
                return Batch(head=None, records=())
            sealed = last.kind == KIND_SEALED
            if last.ordinal <= after.ordinal:
                # At (or past) the tail: nothing to read, and no gap can lie before the tail.
                head = TopicHead(last.epoch, last.ordinal + 1, last.ordinal, sealed, str(last.seq), last.digest)
                return Batch(head=head, records=())
            if own is None and after.ordinal and (located is None or located.epoch != last.epoch):
                # A cursor built from an ordinal carries no sequence, and a batch from the topic's
                # start need not reach it: read from a message at most half a batch before it, so
                # that the batch brings at least as many records after it (found again in a topic
                # re-created since). Not found, the position is behind retention (or the topic
                # changed meanwhile): a read from the start says so.
                located = None if first is None else await locate(js, subject, after.ordinal, limit // 2, first, last)
                previous = None if located is None else located.seq
            records = None if first is None else self._cached(subject, previous, after.ordinal, first, last, limit)
            if records is None:
                if messages is None:
                    messages = await js.batch(subject, 1 if previous is None else previous + 1, limit)
                purged = False
                if js.replicated and messages:
                    # A follower may not have applied a purge the leader has: what the leader no longer
                    # retains is gone, and a reader after it must see the gap, not the stale copies.
                    if first is None:
                        first = await js.first(subject)
                    floor = first.seq if first is not None else last.seq + 1
                    purged = messages[0].seq < floor
                    messages = [message for message in messages if message.seq >= floor]
                messages = [message for message in messages if message.seq <= last.seq]
                if any(message.epoch != last.epoch for message in messages):
                    continue  # the topic was deleted and re-created between the two reads
                if not purged:  # a batch cut at the floor no longer follows ``previous``
                    self._cache.store(subject, previous, messages)
                records = _records(messages, after.ordinal)
            if records:
                head = TopicHead(last.epoch, records[0].ordinal, last.ordinal, sealed, str(last.seq), last.digest)
                return Batch(head=head, records=records)
            exact = await self._exact_head(subject, last)
            if exact is None:
                continue
            if exact.first > after.ordinal + 1:
                return Batch(head=exact, records=())  # removed by retention: the reader reports the gap
            after_reader = messages[0] if messages and own is not None and messages[0].seq > own else None
            if after_reader is not None and (
                _passed(after_reader, after)
                or (after_reader.ordinal <= after.ordinal and attempt == _READ_ATTEMPTS - 1)
            ):
                # A message stored after the reader's position with an ordinal the reader has passed:
                # the topic was deleted and re-created after the reader's last record. The head
                # carries the new incarnation's epoch; the engine tells the reader. (A marker with
                # the reader's own ordinal is that only if re-reading never brings the next record.)
                return Batch(head=exact, records=())
            if js.replicated:
                # A follower that has not applied the newest messages yet may have answered the
                # batch (the head comes from the leader): ask again shortly.
                await asyncio.sleep(0.02)
        raise DurableStreamUnavailableError(f"topic {topic!r} kept changing while it was read")

    def _cached(
        self, subject: str, previous: int | None, after: int, first: StreamMessage, last: StreamMessage, limit: int
    ) -> list[StoredRecord] | None:
        """The records after the position from the read cache, if the server's first and last messages
        confirm they are still retained (removals are prefixes) and of this incarnation."""
        if previous is None:
            messages = self._cache.follow(subject, first.seq, None, last.seq, limit)
        else:
            messages = self._cache.follow(subject, None, previous, last.seq, limit)
        if not messages or first.seq > messages[0].seq or first.epoch != last.epoch:
            return None
        if any(message.epoch != last.epoch for message in messages):
            self._cache.drop(subject)
            return None
        records = _records(messages, after)
        return records or None

    async def trim(self, topic: str, keep_last: int) -> int:
        subject = self.subject(topic)
        async with self._lock(subject):
            removed = await self._trim(subject, keep_last)
        if removed:
            await self._purged(subject)
        return removed

    async def _purged(self, subject: str) -> None:
        """Records of ``subject`` are gone: forget them here, and tell the other backend objects."""
        self._prefetch.drop(subject)
        await self._js.announce_purge(subject.rpartition(".")[2])

    async def _trim(self, subject: str, keep_last: int) -> int:
        for _ in range(_MAX_ATTEMPTS):
            last = await self._js.last(subject)
            if last is None:
                return 0
            head = await self._exact_head(subject, last)
            if head is None:
                continue
            retained = head.last - head.first + 1
            if retained <= keep_last:
                return 0
            if keep_last == 0:
                if last.is_record:
                    # A marker keeps the last ordinal and the epoch once every record is gone.
                    try:
                        last = await self._publish_next(subject, b"", KIND_TRIMMED, last)
                    except WrongSequenceError:
                        continue
                await self._js.purge(subject, keep=1)
            else:
                await self._js.purge(subject, keep=keep_last + (0 if last.is_record else 1))
            return retained - keep_last
        raise DurableStreamUnavailableError(f"trim of {subject!r} lost {_MAX_ATTEMPTS} races with other writers")

    async def delete(self, topic: str) -> bool:
        subject = self.subject(topic)
        async with self._lock(subject):
            self._forget_tail(subject)
            self._cache.drop(subject)
            removed = await self._js.purge(subject) > 0
        await self._purged(subject)
        return removed

    async def info(self, topic: str) -> tuple[int, int, int, bool, str, str] | None:
        """``(length, first, last, sealed, epoch, last digest)`` of the topic, or ``None`` if it does not exist."""
        head = await self.head(topic, create=False)
        if head is None:
            return None
        return head.last - head.first + 1, head.first, head.last, head.sealed, head.epoch, head.last_digest
