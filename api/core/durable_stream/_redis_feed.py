"""The Redis adapter's shared reader: one listener per backend object (one connection per node).

Append, seal, trim and delete scripts ``SPUBLISH`` a short hint on the topic's sharded channel
(see :mod:`._redis_scripts`). One background thread (a greenlet under gevent) holds one dedicated
connection per Redis node, subscribed to the channels of every watched topic, and turns each hint
into ``notify(topic)``. Append hints carry the record itself, which goes into a small per-topic
prefetch (:class:`Prefetch`) so that subscriptions at the live tail get it without another round
trip, however many of them share the topic.

In plain threads the links need not be read by the listener: a subscription about to wait may
take them (the "baton", see :meth:`Feed.wait`) when nobody reads them, or from the listener when it
is the only waiting subscription, and reads the hints in its own thread until its own wake-up
comes. A record then reaches a lone waiter with one thread wake-up, as a raw blocking ``XREAD``
does, instead of two (listener, then subscriber). Whoever holds the baton does what the listener
would, except subscribing, reconnecting and refreshing the topology, which it leaves to the
listener by handing the baton back; it hands it back too when it stops with other subscriptions
still waiting. Under gevent the listener greenlet always reads: handing a hint to another greenlet
costs no thread wake-up.

Hints are only hints: a prefetched record is used only when it provably follows the reader's
position (see :meth:`Prefetch.lookup`), and every gap, epoch and seal decision still comes from the
stream itself. A second thread checks the heads of all watched topics every ``sweep_interval`` in a
few pipelined round trips and wakes the topics whose head moved without a hint (expired keys, keys
deleted by hand, a lost hint): that bounds the delay of such changes for every subscription at once,
so subscriptions need no fallback polls of their own.

Why sharded pub/sub rather than one ``XREAD BLOCK`` over all watched stream keys: in Redis Cluster
a multi-key ``XREAD`` must keep all its keys in one hash slot (``CROSSSLOT`` otherwise, even on one
node), so a per-node ``XREAD`` over many topics is impossible there; one connection can however
``SSUBSCRIBE`` channels of every slot its node serves. The hints also report seals, trims and
deletes made by other processes, which ``XREAD`` never sees, and a newly watched topic is picked
up by writing ``SSUBSCRIBE`` on the open connection, with no blocked command to interrupt.
"""

from __future__ import annotations

import collections
import contextlib
import random
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ._cooperative import Wake, _ThreadWake
from ._driver import Batch, Position, StoredRecord, TopicHead

__all__ = ["Feed", "FeedLink", "Prefetch"]

#: How long the listener sleeps between housekeeping passes when nothing arrives.
_TICK = 1.0
#: An idle link is pinged this often; no answer within the same time means it is dead.
_HEALTH_INTERVAL = 5.0
_RETRY_TICK = 0.05
#: How long a lone waiting subscription waits for the listener to hand over the links.
_HANDOVER_WAIT = 0.01
#: How long a batch built from hints stays shared: the subscriptions it woke take it within this.
_BATCH_LIFETIME = 0.05
#: Topics whose heads one round trip of the periodic check reads.
_SWEEP_CHUNK = 64
_RECONNECT_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)


#: A prefetched record: ``(ordinal, stream ID, payload, epoch, monotonic time received)``. A plain
#: tuple of atoms, which the cyclic GC stops tracking after its first pass: thousands of these live
#: for seconds, and as tracked objects they would make every full collection longer.
_Hint = tuple[int, str, bytes, str, float]


class _TopicView:
    __slots__ = (
        "batches",
        "by_previous",
        "changes",
        "dead_epochs",
        "epoch",
        "first",
        "last",
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
        return TopicHead(self.epoch, self.first, self.last, self.sealed, self.last_native)


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
        self, topic: str, epoch: str, ordinal: int, native: str, previous: str, first: int, payload: bytes | None
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
            state.first = max(state.first, first)
            if ordinal > state.last:
                state.last, state.last_native = ordinal, native
            state.batches.clear()  # built with an older head
            if payload is None or not previous or len(payload) > self.max_payload or ordinal < state.first:
                return
            state.by_previous[previous] = (ordinal, native, payload, epoch, time.monotonic())
            while len(state.by_previous) > self.per_topic:
                state.by_previous.popitem(last=False)

    def sealed(self, topic: str, epoch: str, last: int, native: str) -> None:
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                return
            state.changes += 1
            if state.mirrored and (epoch != state.epoch or last != state.last):
                state.mirrored = False
            if state.epoch == epoch:
                if last > state.last:
                    state.last, state.last_native = last, native
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
                return changed
            changed = head.epoch != state.epoch or head.last != state.last or head.sealed != state.sealed
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
            state.last, state.last_native = head.last, head.last_native
        else:
            state.first = max(state.first, head.first)
            if head.last >= state.last:
                state.last, state.last_native = head.last, head.last_native
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
            ordinal, native, payload, epoch, received = hint
            if ordinal != after.ordinal + 1 or ordinal < state.first:
                return self._idle(state, after)
            oldest = time.monotonic() - self.max_age
            if received < oldest or epoch != state.epoch:
                return self._idle(state, after)
            records = [StoredRecord(ordinal, native, payload)]
            while len(records) < limit:
                following = state.by_previous.get(native)
                if following is None:
                    break
                next_ordinal, next_native, next_payload, next_epoch, next_received = following
                if next_ordinal != ordinal + 1 or next_epoch != epoch or next_received < oldest:
                    break
                ordinal, native = next_ordinal, next_native
                records.append(StoredRecord(ordinal, native, next_payload))
            # The head is the topic as of the newest append seen: records up to it may be missing here
            # (a lost hint), so a reader that stops short of it reads again instead of waiting.
            last = state.last
            head = TopicHead(epoch, state.first, last, state.sealed, native if last <= ordinal else "")
            batch = Batch(head=head, records=tuple(records))
            state.batches[key] = (batch, received)
            self._built.append((time.monotonic(), topic, key))
            return batch

    @staticmethod
    def _idle(state: _TopicView, after: Position) -> Batch | None:
        """A reader at the mirrored head: nothing new, and the mirror is the head."""
        if not state.mirrored or not state.live or time.monotonic() >= state.mirror_until:
            return None
        if after.ordinal != state.last or after.native != state.last_native:
            return None
        return Batch(head=state.head(), records=())


class FeedLink:
    """One dedicated connection to one Redis node, used only by the holder of the feed's baton."""

    def __init__(self, address: str, connection: Any) -> None:
        self.address = address
        self.connection = connection
        self.channels: dict[bytes, str] = {}  # subscribed (or requested) channel -> topic
        self.confirmed: set[bytes] = set()  # channels whose subscription the server confirmed
        self.outstanding: collections.deque[tuple[str, bytes]] = collections.deque()
        self.last_io = time.monotonic()
        self.ping_sent: float | None = None

    def socket(self) -> Any:
        return getattr(self.connection, "_sock", None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.disconnect()


class Feed:
    """The change feed of one Redis backend object; see the module docstring."""

    def __init__(
        self,
        *,
        notify: Callable[[str], None],
        prefetch: Prefetch,
        channel_of: Callable[[str], bytes],
        address_of: Callable[[bytes], str],
        connect: Callable[[str], Any],
        refresh_topology: Callable[[], None],
        sweep: Callable[[list[str]], list[TopicHead | None]],
        sweep_interval: float,
        name: str,
    ) -> None:
        self._notify = notify
        self._prefetch = prefetch
        self._channel_of = channel_of
        self._address_of = address_of
        self._connect = connect
        self._refresh_topology = refresh_topology
        self._sweep = sweep
        self._sweep_interval = sweep_interval
        self._lock = threading.Lock()
        self._watched: dict[str, bytes] = {}
        self._dirty: set[str] = set()  # topics whose subscription must be (re)checked
        self._links: dict[str, FeedLink] = {}
        self._placed: dict[str, tuple[str, bytes]] = {}  # topic -> (node address, channel) subscribed
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopped = threading.Event()
        # Whoever holds the baton reads the links: the listener thread, or a waiting subscription
        # (see wait()). Everything about the links below is touched only by the baton's holder.
        self._baton = threading.Lock()
        self._reader = 0  # the holder's thread ident while it reads
        self._followers = 0  # subscriptions waiting for a wake-up while someone else reads
        self._followers_lock = threading.Lock()
        self._wanted = False  # a lone waiting subscription asks the listener for the baton
        self._vacated = threading.Event()  # the listener is wanted back (see wait() and _run())
        self._refresh_due = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._sweeper = threading.Thread(target=self._sweep_periodically, name=f"{name}:sweep", daemon=True)
        self._sweeper.start()

    # -- called from any thread -------------------------------------------------------------

    def watch(self, topic: str) -> None:
        self._prefetch.watch(topic)
        with self._lock:
            if self._closed:
                return
            self._watched[topic] = self._channel_of(topic)
            self._dirty.add(topic)
        self._call_listener()

    def unwatch(self, topic: str) -> None:
        with self._lock:
            self._watched.pop(topic, None)
            self._dirty.add(topic)
        self._prefetch.unwatch(topic)
        self._call_listener()

    def _call_listener(self) -> None:
        """Have the listener (un)subscribe now: whether it reads, waits for the baton or a
        subscription reads, which then hands the baton back."""
        self._vacated.set()
        self._wake()

    def wait(self, wake: Wake, timeout: float) -> None:
        """Wait for ``wake``; in plain threads, read the links meanwhile if nobody else does.

        A record's hint then reaches its subscription without a hand-over from the listener
        thread to the subscription's thread, which is most of the delivery latency a shared reader
        adds. A subscription takes the links when nobody reads them, or from the listener when it
        is the only one waiting; when it stops (its wake-up came, or the timeout) while others
        wait, the listener takes them back at once. Subscribing, reconnecting and topology
        refreshes stay the listener's. Under gevent the subscription just waits: a greenlet
        reading the links would save nothing.
        """
        # Only a plain thread's wake-up can interrupt a read (and an isinstance allocates nothing
        # on the path of every wait, unlike a getattr that fails under gevent).
        if not isinstance(wake, _ThreadWake) or self._closed:
            wake.wait(timeout)
            return
        # Counted before trying the baton: a reader that lets go of it either sees this waiter
        # (and calls the listener) or let go before the attempt below, which then succeeds.
        with self._followers_lock:
            self._followers += 1
        following = True
        try:
            if self._listener_needed():
                self._vacated.set()
            elif self._baton.acquire(blocking=False) or self._take_from_listener(timeout):
                try:  # at once: the baton must not leak, whatever is raised in this thread
                    with self._followers_lock:
                        self._followers -= 1
                        following = False
                    self._read_while_waiting(wake, timeout)
                finally:
                    self._reader = 0
                    self._baton.release()
                    # A waiter counted now may have failed to take the baton just before: the
                    # listener reads for it.
                    if self._followers or self._listener_needed():
                        self._vacated.set()
                return
            wake.wait(timeout)
        finally:
            if following:
                with self._followers_lock:
                    self._followers -= 1

    def _read_while_waiting(self, wake: _ThreadWake, timeout: float) -> None:
        self._reader = threading.get_ident()
        wake.on_set(self._interrupt_reader)
        try:
            self._lead(wake, timeout)
        finally:
            wake.on_set(None)

    def _listener_needed(self) -> bool:
        return bool(self._dirty) or self._refresh_due or self._closed

    def _take_from_listener(self, timeout: float) -> bool:
        """The only waiter takes the links from the listener thread; others leave them to it."""
        if self._followers > 1 or self._reader != self._thread.ident:
            return False
        self._wanted = True
        self._wake()
        if self._baton.acquire(timeout=min(timeout, _HANDOVER_WAIT)):
            return True
        # The listener is busy (connecting, refreshing). Withdraw the request; if it let go of the
        # baton meanwhile, it must take it back at once, for this waiter and any other.
        self._wanted = False
        self._vacated.set()
        return False

    def _interrupt_reader(self) -> None:
        # A waiting subscription's wake-up was set by another thread while it reads the links.
        if threading.get_ident() != self._reader:
            self._wake()

    def _lead(self, wake: Wake, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not (wake.is_set() or self._listener_needed()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._prefetch.expire(time.monotonic() - _BATCH_LIFETIME)
            self._check_health()
            ready = self._wait(min(remaining, _TICK))
            for link in list(self._links.values()):
                self._drain(link, link.socket() in ready)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stopped.set()
        self._vacated.set()
        self._wake()
        for thread in (self._thread, self._sweeper):
            if thread is not threading.current_thread():
                thread.join(timeout=5.0)
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()

    def link_count(self) -> int:
        return len(self._links)

    def subscribed_topics(self) -> set[str]:
        """Topics whose hints currently arrive (the server confirmed the subscription)."""
        topics = (
            link.channels.get(channel)  # read without the baton: a channel may go meanwhile
            for link in list(self._links.values())
            for channel in list(link.confirmed)
        )
        return {topic for topic in topics if topic is not None}

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # -- the listener thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                # Cleared before each attempt, never after: a hand-back comes after the reader let
                # go of the baton, so it either precedes this attempt (which then succeeds) or
                # ends the wait below. A call left set while a subscription reads would make that
                # wait return at once, again and again.
                self._vacated.clear()
                if self._baton.acquire(blocking=False):
                    try:
                        self._listen()
                    finally:
                        self._reader = 0
                        self._baton.release()
                # A subscription reads the links: take them back when it hands them back, or at
                # the next tick if it is still reading then. (close() sets _closed before _vacated.)
                if not self._closed:
                    self._vacated.wait(_TICK)
        finally:
            with self._baton:
                for link in list(self._links.values()):
                    link.close()
                self._links.clear()

    def _listen(self) -> None:
        """Read the links until the feed closes or a lone waiting subscription asks for them."""
        self._wanted = False  # before _reader names the listener: a request seeing that must stand
        self._reader = threading.get_ident()
        while True:
            # Calls for the listener made until now are answered by this pass (it reads, and
            # subscribes what was watched); one left set would take the baton back from the
            # subscription it is handed to next.
            self._vacated.clear()
            if self._closed or self._wanted:
                break
            if self._refresh_due:
                self._refresh_due = False
                with contextlib.suppress(Exception):
                    self._refresh_topology()
            self._sync()
            # Topics waiting for a reconnect or a topology refresh are retried soon, not at once.
            ready = self._wait(_RETRY_TICK if self._dirty else _TICK)
            for link in list(self._links.values()):
                self._drain(link, link.socket() in ready)
            self._prefetch.expire(time.monotonic() - _BATCH_LIFETIME)
            self._check_health()

    def _wait(self, timeout: float) -> list[Any]:
        sockets = [sock for link in self._links.values() if (sock := link.socket()) is not None]
        try:
            readable, _, _ = select.select([self._wake_r, *sockets], [], [], timeout)
        except (OSError, ValueError):  # a socket closed under us: the drain below notices
            return []
        if self._wake_r in readable:
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
        return list(readable)

    def _sync(self) -> None:
        """Bring every link's subscriptions in line with the watched topics."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            watched = {topic: self._watched.get(topic) for topic in dirty}
        now = time.monotonic()
        retry: list[str] = []
        for topic, channel in watched.items():
            address: str | None = None
            if channel is not None:
                try:
                    address = self._address_of(channel)
                except Exception:  # topology unknown right now: try again shortly
                    retry.append(topic)
                    continue
            placed = self._placed.get(topic)
            if placed is not None and placed != (address, channel):
                del self._placed[topic]
                self._prefetch.live(topic, False)
                old = self._links.get(placed[0])
                if old is not None and old.channels.pop(placed[1], None) is not None:
                    self._send(old, "unsub", placed[1])
                placed = None
            if channel is None or address is None or placed is not None:
                continue
            link = self._links.get(address)
            if link is None:
                link = self._open(address, now)
                if link is None:
                    retry.append(topic)
                    continue
            link.channels[channel] = topic
            self._placed[topic] = (address, channel)
            self._send(link, "sub", channel)
        if retry:
            self._mark_dirty(retry)

    def _open(self, address: str, now: float) -> FeedLink | None:
        if self._retry_at.get(address, 0.0) > now:
            return None
        try:
            connection = self._connect(address)
            connection.connect()
        except Exception:
            failures = self._failures.get(address, 0)
            self._failures[address] = failures + 1
            self._retry_at[address] = now + _RECONNECT_DELAYS[min(failures, len(_RECONNECT_DELAYS) - 1)]
            return None
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        link = FeedLink(address, connection)
        self._links[address] = link
        return link

    def _send(self, link: FeedLink, kind: str, channel: bytes) -> None:
        command = {"sub": "SSUBSCRIBE", "unsub": "SUNSUBSCRIBE", "ping": "PING"}[kind]
        try:
            if kind == "ping":
                link.connection.send_command(command)
            else:
                link.connection.send_command(command, channel)
        except Exception:
            self._fail(link)
            return
        link.outstanding.append((kind, channel))

    def _drain(self, link: FeedLink, readable: bool) -> None:
        if link.socket() is None:
            # Disconnected by redis-py: a read was interrupted (KeyboardInterrupt in a subscription
            # reading the links). Its next call would reconnect silently, without the subscriptions.
            self._fail(link)
            return
        # A socket select() reported readable is read at once: the extra non-blocking probe would
        # only add system calls before the hint reaches its waiters.
        try:
            while self._links.get(link.address) is link and (readable or link.connection.can_read(timeout=0)):
                readable = False
                try:
                    reply = link.connection.read_response()
                except Exception as exc:
                    if not _is_reply_error(exc):
                        raise
                    self._on_error_reply(link)
                    continue
                link.last_io = time.monotonic()
                link.ping_sent = None
                self._on_reply(link, reply)
        except Exception:
            self._fail(link)

    def _on_reply(self, link: FeedLink, reply: Any) -> None:
        if not isinstance(reply, list) or not reply:
            if reply in (b"PONG", "PONG"):  # PING before the first subscription
                self._pop_outstanding(link, "ping")
            return
        kind = reply[0]
        if kind == b"smessage" and len(reply) == 3:
            topic = link.channels.get(reply[1])
            if topic is not None:
                self._on_hint(topic, reply[2])
        elif kind == b"ssubscribe":
            self._pop_outstanding(link, "sub")
            topic = link.channels.get(reply[1])
            if topic is not None:
                link.confirmed.add(reply[1])
                self._prefetch.live(topic, True)
                # Subscribed only now: a record appended since the subscription's last read sent its
                # hint to nobody, so make the subscription read once more.
                self._notify_safely([topic])
        elif kind == b"sunsubscribe":
            link.confirmed.discard(reply[1])
            if link.outstanding and link.outstanding[0] == ("unsub", reply[1]):
                link.outstanding.popleft()
                return
            # Not asked for: the slot moved to another node. Find its new home.
            topic = link.channels.pop(reply[1], None)
            if topic is not None:
                self._placed.pop(topic, None)
                self._prefetch.live(topic, False)
                self._topology_changed([topic])
        elif kind == b"pong":
            self._pop_outstanding(link, "ping")

    def _pop_outstanding(self, link: FeedLink, kind: str) -> None:
        if link.outstanding and link.outstanding[0][0] == kind:
            link.outstanding.popleft()

    def _on_error_reply(self, link: FeedLink) -> None:
        """A command was refused (``MOVED`` while slots migrate): re-route its topic."""
        if not link.outstanding:
            return
        kind, channel = link.outstanding.popleft()
        topic = link.channels.pop(channel, None) if kind == "sub" else None
        if topic is not None:
            self._placed.pop(topic, None)
            self._prefetch.live(topic, False)
            self._topology_changed([topic])

    def _on_hint(self, topic: str, message: bytes) -> None:
        kind = message[:1]
        try:
            if kind in (b"a", b"n"):
                parts = message.split(b"|", 6)
                payload = parts[6] if kind == b"a" and len(parts) == 7 else None
                epoch, ordinal, native, previous, first = parts[1:6]
                self._prefetch.put(
                    topic, epoch.decode(), int(ordinal), native.decode(), previous.decode(), int(first), payload
                )
            elif kind == b"s":
                _, epoch, last, native = message.split(b"|", 3)
                self._prefetch.sealed(topic, epoch.decode(), int(last), native.decode())
            elif kind == b"t":
                self._prefetch.trimmed(topic, int(message[2:]))
            elif kind == b"d":
                self._prefetch.deleted(topic)
            else:
                self._prefetch.trimmed(topic)
        except ValueError:  # not a hint this version understands: the wake-up alone is still right
            self._prefetch.trimmed(topic)
        self._notify_safely([topic])

    # -- the sweeper thread -----------------------------------------------------------------

    def _sweep_periodically(self) -> None:
        """Compare every watched topic's head with what the hints said, once per ``sweep_interval``.

        This is what turns a change without a hint into a short delay: subscriptions themselves
        then need no fallback polls of their own, which at thousands of idle subscriptions per
        process would cost more than delivery. It runs beside the listener so that hints never wait
        for it, in chunks so that one round trip carries many topics.
        """
        while not self._stopped.wait(self._sweep_interval):
            with self._lock:
                topics = list(self._watched)
            for start in range(0, len(topics), _SWEEP_CHUNK):
                if self._stopped.is_set():
                    return
                chunk = topics[start : start + _SWEEP_CHUNK]
                stamps = [self._prefetch.stamp(topic) for topic in chunk]
                try:
                    heads = self._sweep(chunk)
                except Exception:  # the waiters' own reads will report it, or find the server back
                    for topic in chunk:
                        self._prefetch.invalidate(topic)
                    self._notify_safely(chunk)
                    continue
                changed = [
                    topic
                    for topic, stamp, head in zip(chunk, stamps, heads, strict=True)
                    if self._prefetch.swept(topic, stamp, head)
                ]
                self._notify_safely(changed)
                time.sleep(0)  # under gevent, let the subscriptions run between chunks

    def _check_health(self) -> None:
        now = time.monotonic()
        for link in list(self._links.values()):
            if link.ping_sent is not None:
                if now - link.ping_sent > _HEALTH_INTERVAL:
                    self._fail(link)
            elif now - link.last_io > _HEALTH_INTERVAL:
                link.ping_sent = now
                self._send(link, "ping", b"")

    def _fail(self, link: FeedLink) -> None:
        """A link broke: every topic it served may have missed hints, so all of them re-read."""
        if self._links.get(link.address) is not link:
            return
        del self._links[link.address]
        link.close()
        topics = list(link.channels.values())
        for topic in topics:
            self._placed.pop(topic, None)
            self._prefetch.live(topic, False)
        self._retry_at[link.address] = time.monotonic() + _RECONNECT_DELAYS[0]
        self._mark_dirty(topics)
        # The listener refreshes the topology (it may wait on unreachable nodes): not a
        # subscription that happens to be reading, and only after the waiters were woken.
        self._refresh_due = True
        self._notify_safely(topics)

    def _topology_changed(self, topics: list[str]) -> None:
        self._refresh_due = True  # before the topics are placed again (see _listen)
        self._mark_dirty(topics)
        self._notify_safely(topics)

    def _mark_dirty(self, topics: list[str]) -> None:
        with self._lock:
            self._dirty.update(topic for topic in topics if topic in self._watched)

    def _notify_safely(self, topics: list[str]) -> None:
        for topic in topics:
            with contextlib.suppress(Exception):  # a waiter's bug must not stop the shared reader
                self._notify(topic)


def _is_reply_error(exc: Exception) -> bool:
    from redis.exceptions import ResponseError

    return isinstance(exc, ResponseError)
