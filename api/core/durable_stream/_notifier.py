"""Wake-ups for waiting subscriptions, shared by every subscription of one backend object.

Each entered subscription registers a wake event under its topic. Local appends, seals and trims
notify the topic directly; the adapter's change feed (if any) notifies it for changes made by
other connections or processes. A per-topic version counter lets a subscription skip a read when
nothing has happened since its last empty one.
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
        self._feed: ChangeFeed | None = None
        self._feed_opened = False
        self._closed = False

    def version(self, topic: str) -> int:
        return self._versions.get(topic, 0)

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
        if feed is not None:
            feed.close()
