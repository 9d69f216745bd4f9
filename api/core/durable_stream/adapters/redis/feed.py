"""The Redis adapter's shared reader: one listener per backend object (one connection per node).

Append, seal, trim and delete scripts ``SPUBLISH`` a short hint on the topic's sharded channel
(see :mod:`.scripts`). One background thread (a greenlet under gevent) holds one dedicated
connection per Redis node, subscribed to the channels of every watched topic, and turns each hint
into ``notify(topic)``. Append hints carry the record itself, which goes into a small per-topic
prefetch (:class:`~.prefetch.Prefetch`) so that subscriptions at the live tail get it without another round
trip, however many of them share the topic.

In plain threads the links need not be read by the listener: a subscription about to wait may
take them (the "baton", see :meth:`RedisChangeFeed.wait`) when nobody reads them, or from the listener when it
is the only waiting subscription, and reads the hints in its own thread until its own wake-up
comes. A record then reaches a lone waiter with one thread wake-up, as a raw blocking ``XREAD``
does, instead of two (listener, then subscriber). Whoever holds the baton does what the listener
would, except subscribing, reconnecting and refreshing the topology, which it leaves to the
listener by handing the baton back; it hands it back too when it stops with other subscriptions
still waiting. Under gevent the listener greenlet always reads: handing a hint to another greenlet
costs no thread wake-up.

Hints are only hints: a prefetched record is used only when it provably follows the reader's
position (see :meth:`~.prefetch.Prefetch.lookup`), and every gap, epoch and seal decision still comes from the
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

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from ..._cooperative import ThreadWake, Wake
from ..._driver import TopicHead
from .links import LinkReader
from .prefetch import Prefetch

__all__ = ["RedisChangeFeed"]

#: How long the listener sleeps between housekeeping passes when nothing arrives.
_TICK = 1.0
#: How soon topics waiting for a reconnect or a topology refresh are retried.
_RETRY_TICK = 0.05
#: How long a lone waiting subscription waits for the listener to hand over the links.
_HANDOVER_WAIT = 0.01
#: How long a batch built from hints stays shared: the subscriptions it woke take it within this.
_BATCH_LIFETIME = 0.05
#: Topics whose heads one round trip of the periodic check reads.
_SWEEP_CHUNK = 64


class RedisChangeFeed(LinkReader):
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
        super().__init__(
            notify=notify,
            prefetch=prefetch,
            address_of=address_of,
            connect=connect,
            refresh_topology=refresh_topology,
        )
        self._channel_of = channel_of
        self._sweep = sweep
        self._sweep_interval = sweep_interval
        self._closed = False
        self._stopped = threading.Event()
        # Whoever holds the baton reads the links: the listener thread, or a waiting subscription
        # (see wait()). Everything about the links below is touched only by the baton's holder.
        self._baton = threading.Lock()
        self._reader = 0  # the holder's thread ident while it reads
        self._followers = 0  # subscriptions waiting for a wake-up while someone else reads
        self._followers_lock = threading.Lock()
        self._wanted = False  # a lone waiting subscription asks the listener for the baton
        self._vacated = threading.Event()  # the listener is wanted back (see wait() and _run())
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._sweeper = threading.Thread(target=self._sweep_periodically, name=f"{name}:sweep", daemon=True)
        self._sweeper.start()

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
        if not isinstance(wake, ThreadWake) or self._closed:
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
            # A lone waiter that could not take the links (the listener was needed, or busy past the
            # hand-over wait, as on a loaded machine) asks again within a tick, not only at its timeout.
            wake.wait(min(timeout, _TICK) if self._followers == 1 else timeout)
        finally:
            if following:
                with self._followers_lock:
                    self._followers -= 1

    def _read_while_waiting(self, wake: ThreadWake, timeout: float) -> None:
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
