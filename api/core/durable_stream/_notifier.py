"""Wake-ups for waiting subscriptions, shared by every subscription of one backend object.

Each entered subscription registers a wake event under its topic. Local appends, seals and trims
notify the topic directly; the adapter's change feed (if any) notifies it for changes made by
other connections or processes. A per-topic version counter lets a subscription skip a read when
nothing has happened since its last empty one.

A subscription also re-reads now and then without any wake-up, in case one was lost. Those reads
are shared per topic (:meth:`Notifier.last_resort`): one subscription of the topic takes the turn
each interval, every read that reached the topic's last record leaves its epoch, that ordinal and
its time here (:meth:`Notifier.confirm`), and a subscription at exactly that position counts it as
its own. Thousands of idle subscriptions of one topic then cost the store one read per interval,
not thousands; a subscription behind that position still reads for itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._cooperative import Wake
from ._driver import ChangeFeed

__all__ = ["Notifier"]


class Notifier:
    def __init__(self, open_feed: Callable[[Callable[[str], None]], ChangeFeed | None]) -> None:
        self._open_feed = open_feed
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Wake]] = {}
        self._versions: dict[str, int] = {}
        #: topic -> (epoch, last ordinal, monotonic time) of the newest read that reached its end.
        self._confirmed: dict[str, tuple[str, int, float]] = {}
        #: topic -> when a subscription last took the turn of the topic's last-resort re-read.
        self._reread_turns: dict[str, float] = {}
        self._feed: ChangeFeed | None = None
        self._feed_opened = False
        self._closed = False

    def version(self, topic: str) -> int:
        return self._versions.get(topic, 0)

    def confirm(self, topic: str, epoch: str, last_ordinal: int, at: float) -> None:
        """A read begun at monotonic time ``at`` found ``last_ordinal`` to be the topic's last record."""
        known = self._confirmed.get(topic)
        if known is None or known[2] <= at:
            self._confirmed[topic] = (epoch, last_ordinal, at)

    def last_resort(self, topic: str, epoch: str, ordinal: int, last_read: float, now: float, interval: float) -> float:
        """When a subscription due for its last-resort re-read is to count as having read last.

        The first subscription of the topic due in an interval takes the turn: ``last_read`` comes
        back unchanged, so it reads now. Another one, while that read is in flight, counts as having
        read when the turn was taken (it is due again when the turn expires, or is woken earlier by
        what the read finds). Once the read is done, it takes that read's time if the read found its
        own position (``epoch``, ``ordinal``) to be the end, and reads itself otherwise.
        """
        turn = self._reread_turns.get(topic)
        if turn is None or now - turn >= interval:
            self._reread_turns[topic] = now
            return last_read
        known = self._confirmed.get(topic)
        if known is None or known[2] < turn:
            return max(last_read, turn)
        if known[0] == epoch and known[1] == ordinal:
            return max(last_read, known[2])
        return last_read

    def register(self, topic: str, wake: Wake) -> None:
        with self._lock:
            if self._closed:
                return
            waiters = self._waiters.get(topic)
            first = waiters is None
            if waiters is None:
                waiters = self._waiters[topic] = set()
                self._versions.setdefault(topic, 0)
            waiters.add(wake)
            if not self._feed_opened:
                # Opened lazily: a backend used only for appends never starts a watcher.
                self._feed_opened = True
                self._feed = self._open_feed(self.notify)
            feed = self._feed
        if first and feed is not None:
            feed.watch(topic)

    def unregister(self, topic: str, wake: Wake) -> None:
        with self._lock:
            waiters = self._waiters.get(topic)
            if waiters is None:
                return
            waiters.discard(wake)
            last = not waiters
            if last:
                del self._waiters[topic]
                del self._versions[topic]
                self._confirmed.pop(topic, None)
                self._reread_turns.pop(topic, None)
            feed = self._feed
        if last and feed is not None:
            feed.unwatch(topic)

    def wait(self, wake: Wake, timeout: float) -> None:
        """Block a subscription until ``wake`` is set or ``timeout`` passes (see ``ChangeFeed.wait``)."""
        feed = self._feed
        if feed is None:
            wake.wait(timeout)
        else:
            feed.wait(wake, timeout)

    def notify(self, topic: str) -> None:
        with self._lock:
            waiters = self._waiters.get(topic)
            if not waiters:
                return
            self._versions[topic] += 1
            wakes = list(waiters)
        for wake in wakes:
            wake.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            feed, self._feed = self._feed, None
            self._waiters.clear()
            self._versions.clear()
            self._confirmed.clear()
            self._reread_turns.clear()
        if feed is not None:
            feed.close()
