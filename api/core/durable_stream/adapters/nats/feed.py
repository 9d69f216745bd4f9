"""The NATS adapter's change feed: the stream's republished messages of watched topics, and a head check.

The stream republishes every message it stores on a core NATS subject of its own
(``_DSLIVE.<stream>.<token>``, see :mod:`.prefetch`), with the sequence of the subject's previous
message. The feed subscribes (core NATS, no JetStream consumer) to that subject for every watched
topic on the backend object's one connection, puts each message into the backend object's
:class:`~.prefetch.LivePrefetch` and wakes the topic's subscriptions, which then take it without a
round trip. A trim or delete made through any backend object sends a notice on the same subject,
which forgets the topic's prefetched messages. Changes that send nothing (a limit the server
applied, a purge by hand, a message missed while the subscription was being set up) are found by a
check of every watched topic's last sequence each ``poll_interval``. A lost or restored connection
wakes every watched topic at once, so waiting readers report the outage (or continue) within a
round trip.

The feed runs on the adapter's loop thread; wake-ups reach waiting subscriptions through
``notify``, called directly in plain threads and handed to the gevent hub with its thread-safe
callback under gevent (the notifier's lock belongs to the hub's world).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

from ..._cooperative import Wake, gevent_active
from .jetstream import JetStream
from .loop import LoopThread, raw_lock
from .messages import parse_live
from .prefetch import LivePrefetch

__all__ = ["NatsChangeFeed"]

#: Watched topics whose last message one round of the periodic check asks for at once.
_CHECK_CHUNK = 64


class NatsChangeFeed:
    """The change feed of one NATS backend object; see the module docstring."""

    def __init__(
        self,
        *,
        notify: Callable[[str], None],
        connection: Callable[[], tuple[LoopThread, JetStream, LivePrefetch]],
        subject_of: Callable[[str], str],
        poll_interval: float,
    ) -> None:
        self._notify = notify
        self._connection = connection
        self._loop, self._js, self._prefetch = connection()
        self._pid = os.getpid()
        self._subject_of = subject_of
        self._poll_interval = poll_interval
        self._lock = raw_lock()
        self._watched: set[str] = set()
        self._closed = False
        # Loop-side only:
        self._subs: dict[str, Any] = {}
        self._seen: dict[str, int] = {}
        self._sync_lock: asyncio.Lock | None = None
        self._hub: Any = None
        if gevent_active():
            from gevent import get_hub

            self._hub = get_hub()
        self._loop.submit(self._check_periodically)

    def _deliver(self, topics: list[str]) -> None:
        """Wake ``topics`` (called on the loop thread)."""
        if not topics:
            return
        hub = self._hub
        if hub is None:
            for topic in topics:
                self._notify(topic)
        else:
            hub.loop.run_callback_threadsafe(self._notify_all, topics)

    def changed(self, topic: str) -> None:
        """On the loop thread: this backend object appended to ``topic`` (its message is prefetched)."""
        if topic in self._watched:  # a set's membership test needs no lock
            self._deliver([topic])

    def _notify_all(self, topics: list[str]) -> None:
        for topic in topics:
            self._notify(topic)

    # -- ChangeFeed ---------------------------------------------------------------------------

    def watch(self, topic: str) -> None:
        self._rebind_after_fork()
        with self._lock:
            if self._closed:
                return
            self._watched.add(topic)
        self._prefetch.watch(self._subject_of(topic))
        self._loop.submit(self._sync)

    def unwatch(self, topic: str) -> None:
        self._rebind_after_fork()
        with self._lock:
            self._watched.discard(topic)
            watched = topic in self._watched
        if not watched:
            self._prefetch.unwatch(self._subject_of(topic))
        self._loop.submit(self._sync)

    def forked(self) -> None:
        """In a forked child (at fork time): the parent's lock may be held, its loop thread is gone."""
        self._lock = raw_lock()

    def _rebind_after_fork(self) -> None:
        if self._pid == os.getpid():
            return
        # The child's own loop thread and connection (the driver opens them on first use): the
        # parent's subscriptions and checks do not exist here.
        self._loop, self._js, self._prefetch = self._connection()
        self._pid = os.getpid()
        with self._lock:
            inherited = list(self._watched)
        for topic in inherited:
            self._prefetch.watch(self._subject_of(topic))
        self._subs, self._seen, self._sync_lock = {}, {}, None
        self._loop.submit(self._check_periodically)
        self._loop.submit(self._sync)  # the watched topics, inherited with the notifier's registrations

    def wait(self, wake: Wake, timeout: float) -> None:
        # A subscription inherited from the parent may be the first to wait in a forked child.
        self._rebind_after_fork()
        wake.wait(timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._watched.clear()
        self._loop.submit(self._sync)

    def connection_changed(self, connected: bool) -> None:
        """On the loop thread: wake every watched topic (readers fail fast, or continue)."""
        with self._lock:
            topics = list(self._watched)
        if connected:
            self._seen.clear()
            for topic in list(self._subs):  # re-subscribed by nats-py before it reported the reconnect
                self._prefetch.live(self._subject_of(topic))
        self._deliver(topics)

    # -- loop side ----------------------------------------------------------------------------

    async def _sync(self) -> None:
        """Subscribe the watched topics' subjects and unsubscribe the others."""
        if self._sync_lock is None:
            self._sync_lock = asyncio.Lock()
        async with self._sync_lock:
            with self._lock:
                wanted = set(self._watched)
            nc = self._js.nc
            for topic in [topic for topic in self._subs if topic not in wanted]:
                sub = self._subs.pop(topic)
                self._seen.pop(topic, None)
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            added = [topic for topic in wanted if topic not in self._subs]
            if nc is None or (self._closed and not wanted):
                return
            subscribed: list[str] = []
            for topic in added:
                try:
                    subject = self._subject_of(topic)
                    live = self._js.live_subject(subject.rpartition(".")[2])
                    self._subs[topic] = await nc.subscribe(live, cb=self._callback(topic, subject))
                except Exception:
                    continue  # disconnected: the periodic check wakes it, the next watch retries
                subscribed.append(subject)
            with contextlib.suppress(Exception):
                await nc.flush(timeout=10)  # the server has the subscriptions now
                for subject in subscribed:
                    self._prefetch.live(subject)
            # Whatever was appended before the subscription existed: one read per new topic.
            self._deliver(added)

    def _callback(self, topic: str, subject: str) -> Callable[[Any], Any]:
        prefetch = self._prefetch

        async def on_message(msg: Any) -> None:
            try:
                stored = parse_live(msg)
            except Exception:
                stored = None  # not ours: the readers' own read reports it
            if stored is None:
                prefetch.drop(subject)  # a trim or delete (or a message the reader must judge itself)
            else:
                prefetch.put(subject, stored[0], stored[1])
                if topic in self._seen:
                    # Seen here: the head check wakes the topic only for changes that were not.
                    self._seen[topic] = max(self._seen[topic], stored[1].seq)
            self._deliver([topic])

        return on_message

    async def _check_periodically(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._poll_interval)
            with self._lock:
                topics = list(self._watched)
            if not topics or not self._js.connected:
                continue
            for start in range(0, len(topics), _CHECK_CHUNK):
                chunk = topics[start : start + _CHECK_CHUNK]
                results = await asyncio.gather(
                    *(self._js.last(self._subject_of(topic)) for topic in chunk), return_exceptions=True
                )
                changed: list[str] = []
                for topic, result in zip(chunk, results, strict=True):
                    if isinstance(result, BaseException):
                        changed.append(topic)  # its readers will report it, or find the server back
                        continue
                    seq = 0 if result is None else result.seq
                    seen = self._seen.get(topic)
                    self._seen[topic] = seq
                    if seen is not None and seq < seen:
                        self._prefetch.drop(self._subject_of(topic))  # purged by hand, or re-created
                    elif seen is not None and seen != seq:
                        self._prefetch.stale(self._subject_of(topic))  # a message not seen republished
                    if seen is not None and seen != seq:  # (the first sighting: watch() woke it)
                        changed.append(topic)
                self._deliver(changed)
