"""The NATS JetStream adapter's driver: the synchronous face of the adapter's event loop.

Every driver method hands one coroutine of :class:`~.topics.TopicStore` to the backend object's
loop thread (:class:`~.loop.LoopThread`) and waits for it in the caller's world (a plain thread, or a
greenlet under gevent). :func:`_translate` is the one place where nats-py's exceptions become
contract errors. After ``fork()`` the child starts its own loop thread and connection on first use:
nothing of the parent's (a loop, a lock, a socket) is used there.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from ..._contract import DurableStreamError, DurableStreamUnavailableError
from ..._digest import sha1_chain
from ..._driver import Appended, Batch, ChangeFeed, Position, Refused, TopicHead, TopicInfo
from ..._options import Options
from .feed import NatsChangeFeed
from .jetstream import JetStream
from .loop import LoopThread
from .prefetch import LivePrefetch
from .publisher import DirectPublisher
from .settings import NatsSettings
from .topics import TopicStore

__all__ = ["NatsDriver", "open_driver"]


#: Drivers whose process-local state must be reset in a forked child.
_DRIVERS: weakref.WeakSet[NatsDriver] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for driver in list(_DRIVERS):
        driver._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Connection:
    """The loop thread, the connection and the topic store of one process."""

    def __init__(self, settings: NatsSettings, on_connection_change: Callable[[bool], None]) -> None:
        self.loop = LoopThread(f"durable-stream-nats-{secrets.token_hex(3)}")
        self.js = JetStream(settings, on_connection_change)
        self.prefetch = LivePrefetch(max_records=settings.max_records, max_age_seconds=settings.max_age_seconds)
        self.topics = TopicStore(self.js, settings.subject_prefix, self.prefetch)
        self.publisher = DirectPublisher(settings, self.js.server)

    def close(self) -> None:
        self.publisher.close()
        with contextlib.suppress(Exception):
            self.loop.run(self.js.close, 5.0)
        self.loop.stop()


class NatsDriver:
    #: A subscription's own re-read without a wake-up, a last resort: the change feed wakes topics on
    #: every message of their subjects and checks the watched topics' heads every ``poll_interval``.
    reread_interval = 15.0
    #: What the adapter computes for each record before its compare-and-set publish.
    chain = staticmethod(sha1_chain)

    def __init__(self, settings: NatsSettings) -> None:
        self._settings = settings
        self.identity = f"nats:{settings.stream}:{settings.subject_prefix}"
        self.reread_interval = max(NatsDriver.reread_interval, 10 * settings.poll_interval)
        self._timeout = settings.request_timeout
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._feed: NatsChangeFeed | None = None
        self._conn = self._open()
        _DRIVERS.add(self)

    def _open(self) -> _Connection:
        conn = _Connection(self._settings, self._connection_changed)
        try:
            _translate("connect", lambda: conn.loop.run(conn.js.connect, self._settings.connect_timeout + 5.0))
            # A stream that exists with other settings is a configuration error (ValueError).
            _translate("stream setup", lambda: conn.loop.run(conn.js.ensure_stream, self._timeout), config=True)
        except BaseException:
            conn.close()
            raise
        return conn

    def _forked(self) -> None:
        # In the child: the parent's loop thread does not exist here and its lock may be held.
        self._lock = threading.Lock()
        if self._feed is not None:
            self._feed.forked()

    def _connection(self) -> _Connection:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    if self._closed:
                        raise DurableStreamUnavailableError("the NATS backend is closed")
                    self._conn = self._open()  # the parent's connection is abandoned, not closed
                    self._pid = os.getpid()
        return self._conn

    def _run[T](self, operation: str, factory: Callable[[TopicStore], Coroutine[Any, Any, T]]) -> T:
        conn = self._connection()
        return _translate(operation, lambda: conn.loop.run(lambda: factory(conn.topics), self._timeout + 1.0))

    def _connection_changed(self, connected: bool) -> None:
        """Called on the loop thread when the connection drops or comes back."""
        conn: _Connection | None = getattr(self, "_conn", None)  # None: the first connect() failed
        if conn is not None:
            # Lost: the server may come back without what was prefetched; back: whatever was remembered.
            conn.prefetch.clear()
            if connected:
                conn.topics.forget()
        feed = self._feed
        if feed is not None:
            feed.connection_changed(connected)

    # -- Driver -------------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes, expect: Position | None = None) -> Appended | Refused:
        conn = self._connection()
        # Uncontended, the publish goes out from this thread: no hand-over to the loop and back.
        direct = _translate("append", lambda: conn.topics.append_direct(topic, payload, conn.publisher, expect))
        if direct is not None:
            return direct
        with conn.topics.through_loop(topic):
            return self._run("append", lambda store: store.append(topic, payload, expect))

    def seal(self, topic: str) -> None:
        self._run("seal", lambda store: store.seal(topic))

    def head(self, topic: str, *, create: bool) -> TopicHead | None:
        return self._run("head", lambda store: store.head(topic, create=create))

    def read(self, topic: str, after: Position, limit: int) -> Batch:
        conn = self._connection()
        # A reader at the live tail: the records the server just stored are here already, and taking
        # them in the caller's thread saves the round trip and both hand-overs to the loop thread.
        prefetched = conn.prefetch.lookup(conn.topics.subject(topic), after, limit)
        if prefetched is not None:
            return prefetched
        return self._run("read", lambda store: store.read(topic, after, limit))

    def topic_info(self, topic: str) -> TopicInfo | None:
        found = self._run("topic info", lambda store: store.info(topic))
        if found is None:
            return None
        length, first, last, sealed, epoch, digest = found
        return TopicInfo(topic, length, first, last, sealed, epoch, digest)

    def trim(self, topic: str, keep_last: int) -> int:
        return self._run("trim", lambda store: store.trim(topic, keep_last))

    def delete(self, topic: str) -> bool:
        return self._run("delete", lambda store: store.delete(topic))

    def enforce_retention(self) -> int:
        # max_records (max_msgs_per_subject) and max_age are the stream's own limits: the server
        # applies them continuously, so there is nothing left to remove here.
        self._connection()
        return 0

    def consumer_count(self) -> int:
        """JetStream consumers on the stream (the adapter itself never creates one)."""
        conn = self._connection()
        return _translate("stream info", lambda: conn.loop.run(conn.js.consumer_count, self._timeout))

    def stream_leader(self) -> str:
        """The server name of the stream's leader in a cluster."""
        conn = self._connection()
        return _translate("stream info", lambda: conn.loop.run(conn.js.stream_leader, self._timeout))

    def open_change_feed(self, notify: Callable[[str], None]) -> ChangeFeed | None:
        conn = self._connection()

        feeds: list[NatsChangeFeed] = []

        def connection() -> tuple[LoopThread, JetStream, LivePrefetch]:
            current = self._connection()  # in a forked child: the child's own
            if feeds:
                current.topics.on_change = feeds[0].changed
            return current.loop, current.js, current.prefetch

        feed = NatsChangeFeed(
            notify=notify,
            connection=connection,
            subject_of=conn.topics.subject,
            poll_interval=self._settings.poll_interval,
        )
        feeds.append(feed)
        conn.topics.on_change = feed.changed
        self._feed = feed
        return feed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._pid == os.getpid():
            self._conn.close()


def _translate[T](operation: str, call: Callable[[], T], *, config: bool = False) -> T:
    """Run ``call``; the one place where nats-py's (and asyncio's) exceptions become contract errors."""
    try:
        return call()
    except DurableStreamError:
        raise
    except ValueError:
        if config:
            raise
        raise DurableStreamUnavailableError(f"NATS {operation} failed") from None
    except Exception as exc:
        raise DurableStreamUnavailableError(f"NATS {operation} failed: {exc!r}") from exc


def open_driver(url: str, options: Options) -> NatsDriver:
    return NatsDriver(NatsSettings.from_url(url, options))
