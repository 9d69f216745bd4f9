"""The Redis adapter's prefetch: what the shared reader (or a local append) has just seen of each topic.

Append hints carry the record itself; it waits here, keyed by its predecessor's stream ID, so that
subscriptions at the live tail get it without another round trip, however many of them share the
topic. See :class:`Prefetch` for when a prefetched record or head may be used.
"""

from __future__ import annotations

import collections
import random
import threading
import time

from ..._driver import Batch, Position, StoredRecord, TopicHead

__all__ = ["Prefetch", "apply_hint"]


#: A prefetched record: ``(ordinal, stream ID, payload, epoch, monotonic time received, digest)``. A
#: plain tuple of atoms, which the cyclic GC stops tracking after its first pass: thousands of these
#: live for seconds, and as tracked objects they would make every full collection longer.
_Hint = tuple[int, str, bytes, str, float, str]


class _TopicView:
    __slots__ = (
        "batches",
        "by_previous",
        "changes",
        "dead_epochs",
        "epoch",
        "first",
        "last",
        "last_digest",
        "last_native",
        "live",
        "mirror_until",
        "mirrored",
        "sealed",
    )

    def __init__(self) -> None:
        self.by_previous: collections.OrderedDict[str, _Hint] = collections.OrderedDict()
        # Batches already built, by (predecessor, limit): every subscription of a topic at the same
        # position gets the same immutable batch. Cleared whenever the topic's hints change, and
        # soon after they were built (see Prefetch.expire).
        self.batches: dict[tuple[str, int], tuple[Batch, float]] = {}  # with its oldest hint's arrival
        # The head as known from hints, reads and checks (the highest ordinal seen in this epoch).
        self.epoch = ""
        self.first = 0
        self.last = 0
        self.last_native = ""
        self.last_digest = ""
        self.sealed = False
        self.dead_epochs: set[str] = set()
        self.changes = 0  # every event seen for the topic; a read that overlaps one is not mirrored
        self.live = False  # the shared reader's subscription to the topic's hints is confirmed
        # The known head is exactly the server's (until mirror_until): see Prefetch, "mirrored".
        self.mirrored = False
        self.mirror_until = 0.0

    def forget_records(self) -> None:
        self.by_previous.clear()
        self.batches.clear()

    def forget_head(self) -> None:
        self.mirrored = False
        self.changes += 1

    def head(self) -> TopicHead:
        return TopicHead(self.epoch, self.first, self.last, self.sealed, self.last_native, self.last_digest)


class Prefetch:
    """What the shared reader (or a local append) has just seen of each watched topic.

    Records, keyed by their predecessor: a record is handed to a reader only if its predecessor's
    stream ID is the reader's own position and its ordinal is the next one. Stream IDs grow within a
    stream and an incarnation's ordinals are dense, so such a record is exactly the record a read
    from the server would have returned first at the moment the record was appended; the
    subscription still checks the batch's epoch. Records older than ``max_age`` or below a known
    trim are never handed out, and at most ``per_topic`` records are kept per topic.

    The head, as announced: every hint, every read from the server and every periodic head check
    that overlapped no hint updates what is known of the topic's epoch, last ordinal and seal. A
    periodic check that finds the server elsewhere (:meth:`swept`) is a change that sent no hint (key
    expiry, keys deleted by hand, ``FLUSHALL``) or a lost hint, and wakes the topic's waiters.

    The head, mirrored: while the topic's hint subscription is live, that known head is also handed
    to a reader already at it (a subscription's last-resort re-read) without a round trip, for at
    most ``mirror_age`` after the read or check that confirmed it; a broken link forgets every
    mirror at once.
    """

    def __init__(
        self, *, per_topic: int = 16, max_age: float = 1.0, max_payload: int = 16384, mirror_age: float = 5.0
    ) -> None:
        self.per_topic = per_topic
        self.max_age = max_age
        self.max_payload = max_payload
        self.mirror_age = mirror_age
        self._topics: dict[str, _TopicView] = {}
        self._built: collections.deque[tuple[float, str, tuple[str, int]]] = collections.deque()
        self._lock = threading.Lock()

    def watch(self, topic: str) -> None:
        with self._lock:
            self._topics.setdefault(topic, _TopicView())

    def unwatch(self, topic: str) -> None:
        with self._lock:
            state = self._topics.pop(topic, None)
            if state is not None:
                state.forget_records()  # a reader still holding the view must not find a batch

    def clear(self) -> None:
        with self._lock:
            for state in self._topics.values():
                state.forget_records()
                state.forget_head()

    def live(self, topic: str, live: bool) -> None:
        """The shared reader's subscription to the topic's hints started (or stopped) being live."""
        with self._lock:
            state = self._topics.get(topic)
            if state is not None:
                state.live = live
                state.forget_head()
                if not live:
                    state.forget_records()

    def put(
        self,
        topic: str,
        epoch: str,
        ordinal: int,
        native: str,
        previous: str,
        first: int,
        payload: bytes | None,
        digest: str,
    ) -> None:
        """A record was appended (``payload`` is ``None`` when the hint did not carry it)."""
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                return
            state.changes += 1
            if state.mirrored and (epoch != state.epoch or ordinal > state.last + 1):
                state.mirrored = False  # a hint was missed, or a new incarnation: read again
            if epoch in state.dead_epochs:
                return
            if state.epoch != epoch:
                state.forget_records()
                state.epoch, state.first, state.last, state.last_native, state.sealed = epoch, first, 0, "", False
                state.last_digest = ""
            state.first = max(state.first, first)
            if ordinal > state.last:
                state.last, state.last_native, state.last_digest = ordinal, native, digest
            state.batches.clear()  # built with an older head
            if payload is None or not previous or len(payload) > self.max_payload or ordinal < state.first:
                return
            state.by_previous[previous] = (ordinal, native, payload, epoch, time.monotonic(), digest)
            while len(state.by_previous) > self.per_topic:
                state.by_previous.popitem(last=False)

    def sealed(self, topic: str, epoch: str, last: int, native: str, digest: str) -> None:
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                return
            state.changes += 1
            if state.mirrored and (epoch != state.epoch or last != state.last):
                state.mirrored = False
            if state.epoch == epoch:
                if last > state.last:
                    state.last, state.last_native, state.last_digest = last, native, digest
                elif last < state.last or digest != state.last_digest:
                    state.mirrored = False  # not the head the hints announced: read it from the server
                state.sealed = True
                state.batches.clear()  # built with the unsealed head

    def trimmed(self, topic: str, first: int | None = None) -> None:
        """Records were removed: forget everything prefetched, and ignore late hints below ``first``."""
        with self._lock:
            state = self._topics.get(topic)
            if state is not None:
                state.forget_records()
                state.forget_head()
                if first is not None:
                    state.first = max(state.first, first)

    def deleted(self, topic: str) -> None:
        with self._lock:
            state = self._topics.get(topic)
            if state is not None:
                state.forget_records()
                state.forget_head()
                if state.epoch:
                    state.dead_epochs.add(state.epoch)
                state.epoch, state.first, state.last, state.last_native, state.sealed = "", 0, 0, "", False
                state.last_digest = ""

    def invalidate(self, topic: str) -> None:
        with self._lock:
            state = self._topics.get(topic)
            if state is not None:
                state.forget_head()

    def stamp(self, topic: str) -> int | None:
        """Taken before a read from the server; ``None`` when the topic is not watched."""
        with self._lock:
            state = self._topics.get(topic)
            return state.changes if state is not None else None

    def observe(self, topic: str, stamp: int | None, head: TopicHead) -> None:
        """A subscription's read from the server returned ``head``: adopt it if nothing happened meanwhile."""
        if stamp is None:
            return
        with self._lock:
            state = self._topics.get(topic)
            if state is not None and state.changes == stamp:
                self._adopt(state, head)

    def swept(self, topic: str, stamp: int | None, head: TopicHead | None) -> bool:
        """The periodic head check read ``head`` (``None``: no such topic); return whether waiters must re-read.

        That is when the head differs from what the hints announced: a change that sent no hint (key
        expiry, keys deleted by hand, ``FLUSHALL``) or a hint that was lost. A check that overlapped a
        hint proves nothing and is ignored; the hint woke the waiters anyway, and the next check looks again.
        """
        if stamp is None:
            return False
        with self._lock:
            state = self._topics.get(topic)
            if state is None or state.changes != stamp:
                return False
            if head is None:
                changed = bool(state.epoch)
                state.forget_records()
                state.forget_head()
                if state.epoch:
                    state.dead_epochs.add(state.epoch)
                state.epoch, state.first, state.last, state.last_native, state.sealed = "", 0, 0, "", False
                state.last_digest = ""
                return changed
            changed = (
                head.epoch != state.epoch
                or head.last != state.last
                or head.sealed != state.sealed
                or head.last_digest != state.last_digest
            )
            if changed:
                state.changes += 1  # reads in flight started before this news: they must not mirror
            self._adopt(state, head)
            return changed

    def _adopt(self, state: _TopicView, head: TopicHead) -> None:
        """``head`` is the topic as of now (no hint arrived since it was read): remember, and mirror it."""
        state.batches.clear()  # built with an older head
        if head.epoch != state.epoch:
            state.forget_records()
            if state.epoch:
                state.dead_epochs.add(state.epoch)  # late hints of the old incarnation are ignored
            state.epoch, state.first = head.epoch, head.first
            state.last, state.last_native, state.last_digest = head.last, head.last_native, head.last_digest
        else:
            state.first = max(state.first, head.first)
            if head.last >= state.last:
                state.last, state.last_native, state.last_digest = head.last, head.last_native, head.last_digest
        state.sealed = head.sealed
        state.mirrored = state.live and state.last == head.last
        if state.mirrored:
            # Spread the expiries: topics mirrored together must not all read again together.
            state.mirror_until = time.monotonic() + self.mirror_age * random.uniform(0.5, 1.0)

    def expire(self, older_than: float) -> None:
        """Drop shared batches built before ``older_than``: their readers have taken them by then, and
        a cached batch kept until the topic's next append would outlive the cyclic GC's young
        generations with everything it holds."""
        built = self._built
        if not built or built[0][0] >= older_than:
            return
        with self._lock:
            while built and built[0][0] < older_than:
                _, topic, key = built.popleft()
                state = self._topics.get(topic)
                if state is not None:
                    state.batches.pop(key, None)

    def lookup(self, topic: str, after: Position, limit: int) -> Batch | None:
        """The batch a read after ``after`` would return, if what was seen proves it; else ``None``."""
        if not after.native:
            return None
        key = (after.native, limit)
        state = self._topics.get(topic)
        if state is None:
            return None
        # Without the lock: a cached batch leaves the cache (under the lock) before anything that
        # outdates it is announced, so one found here is still right.
        cached = state.batches.get(key)
        if cached is not None and cached[1] >= time.monotonic() - self.max_age:
            return cached[0]
        with self._lock:
            hint = state.by_previous.get(after.native)
            if hint is None:
                return self._idle(state, after)
            ordinal, native, payload, epoch, received, digest = hint
            if ordinal != after.ordinal + 1 or ordinal < state.first:
                return self._idle(state, after)
            oldest = time.monotonic() - self.max_age
            if received < oldest or epoch != state.epoch:
                return self._idle(state, after)
            records = [StoredRecord(ordinal, native, payload, digest)]
            while len(records) < limit:
                following = state.by_previous.get(native)
                if following is None:
                    break
                next_ordinal, next_native, next_payload, next_epoch, next_received, next_digest = following
                if next_ordinal != ordinal + 1 or next_epoch != epoch or next_received < oldest:
                    break
                ordinal, native, digest = next_ordinal, next_native, next_digest
                records.append(StoredRecord(ordinal, native, next_payload, digest))
            # The head is the topic as of the newest append seen: records up to it may be missing here
            # (a lost hint), so a reader that stops short of it reads again instead of waiting.
            last = state.last
            at_end = last <= ordinal
            head = TopicHead(epoch, state.first, last, state.sealed, native if at_end else "", digest if at_end else "")
            batch = Batch(head=head, records=tuple(records))
            state.batches[key] = (batch, received)
            self._built.append((time.monotonic(), topic, key))
            return batch

    @staticmethod
    def _idle(state: _TopicView, after: Position) -> Batch | None:
        """A reader at the mirrored head: nothing new, and the mirror is the head."""
        if not state.mirrored or not state.live or time.monotonic() >= state.mirror_until:
            return None
        if after.ordinal != state.last or after.native != state.last_native or after.digest != state.last_digest:
            return None
        return Batch(head=state.head(), records=())


def apply_hint(prefetch: Prefetch, topic: str, message: bytes) -> None:
    """Record what a hint message (see :mod:`.scripts`) says about ``topic``."""
    kind = message[:1]
    try:
        if kind in (b"A", b"N"):
            parts = message.split(b"|", 7)
            payload = parts[7] if kind == b"A" and len(parts) == 8 else None
            epoch, ordinal, native, previous, first, digest = parts[1:7]
            prefetch.put(
                topic,
                epoch.decode(),
                int(ordinal),
                native.decode(),
                previous.decode(),
                int(first),
                payload,
                digest.decode(),
            )
        elif kind == b"S":
            _, epoch, last, native, digest = message.split(b"|", 4)
            prefetch.sealed(topic, epoch.decode(), int(last), native.decode(), digest.decode())
        elif kind == b"t":
            prefetch.trimmed(topic, int(message[2:]))
        elif kind == b"d":
            prefetch.deleted(topic)
        else:
            prefetch.trimmed(topic)
    except ValueError:  # not a hint this version understands: the wake-up alone is still right
        prefetch.trimmed(topic)
