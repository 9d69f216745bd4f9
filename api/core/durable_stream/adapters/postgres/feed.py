"""The PostgreSQL adapter's change feed: ``pg_notify`` hints out, ``LISTEN`` and a periodic head check in.

One dedicated connection and one thread per driver (:class:`HintConnection`) send this process's
hints, listen for other processes' hints and re-read the heads of watched topics every
``poll_interval``; :class:`PostgresChangeFeed` is the engine's view of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from ..._cooperative import Wake
from ..._driver import ChangeFeed
from .errors import describe_error

__all__ = ["HINT_BATCH_GAP", "HintConnection", "PostgresChangeFeed"]

log = logging.getLogger(__name__)

#: Minimum spacing of hint batches from one process while appends keep coming.
HINT_BATCH_GAP = 0.002


class PostgresChangeFeed:
    """The :class:`~._driver.ChangeFeed` view of the hint connection."""

    def __init__(self, hints: HintConnection) -> None:
        self._hints = hints

    def watch(self, topic: str) -> None:
        self._hints.watch(topic)

    def unwatch(self, topic: str) -> None:
        self._hints.unwatch(topic)

    def wait(self, wake: Wake, timeout: float) -> None:
        wake.wait(timeout)

    def close(self) -> None:
        self._hints.close_feed()


_UNKNOWN = object()


class HintConnection:
    """One thread and one dedicated connection per driver, for everything that is not a query.

    - Sends ``pg_notify`` hints for topics this process changed, coalescing whatever piled up
      while the previous batch was in flight (one round trip, and PostgreSQL's global notify lock,
      per batch rather than per append).
    - ``LISTEN``\\ s on the channels of watched topics and wakes them when another process hints.
    - Every ``poll_interval`` re-reads the heads of all watched topics in one query and wakes those
      that changed: this is what makes a lost or disabled hint a delay instead of a loss.
    - When its connection fails it wakes every watched topic, so subscriptions re-read at once
      (and either continue on a fresh pooled connection or report the outage).
    """

    def __init__(
        self,
        *,
        connect: Callable[[], psycopg.Connection[Any]],
        poll_sql: str,
        channel_prefix: str,
        channels: int,
        send: bool,
        listen: bool,
        poll_interval: float,
    ) -> None:
        self._connect = connect
        self._poll_sql = poll_sql
        self._prefix = channel_prefix
        self._channels = channels
        self._send = send
        self._listen = listen
        self._poll_interval = poll_interval
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._watched: dict[str, object] = {}
        self._fresh: set[str] = set()
        self._watch_changed = False
        self._notify: Callable[[str], None] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pipe_open = True
        # Only touched by the thread:
        self._conn: psycopg.Connection[Any] | None = None
        self._listening: set[str] = set()
        self._own_pid = 0

    def channel(self, topic: str) -> str:
        digest = hashlib.blake2b(topic.encode(), digest_size=4).digest()
        return f"{self._prefix}_{int.from_bytes(digest, 'big') % self._channels}"

    # -- called from any thread ---------------------------------------------------------------

    def announce(self, topic: str, *, local: bool = False) -> None:
        if local:
            notify = self._notify
            if notify is not None:
                notify(topic)
        if not self._send:
            return
        with self._lock:
            if self._closed:
                return
            # Non-empty means the thread already has a flush scheduled: no need to wake it again.
            wake = not self._pending
            self._pending.add(topic)
            self._ensure_thread()
        if wake:
            self._wake()

    def open_feed(self, notify: Callable[[str], None]) -> ChangeFeed:
        with self._lock:
            self._notify = notify
        return PostgresChangeFeed(self)

    def watch(self, topic: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._watched[topic] = _UNKNOWN
            self._fresh.add(topic)
            self._watch_changed = True
            self._ensure_thread()
        self._wake()

    def unwatch(self, topic: str) -> None:
        with self._lock:
            self._watched.pop(topic, None)
            self._fresh.discard(topic)
            self._watch_changed = True
        self._wake()

    def close_feed(self) -> None:
        with self._lock:
            self._notify = None
            self._watched.clear()
            self._fresh.clear()
            self._watch_changed = True
        self._wake()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread after a last attempt to send pending hints."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._notify = None
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():  # stuck on an unresponsive server; it exits when the call fails
                return
        self._close_pipe()

    def _close_pipe(self) -> None:
        with self._lock:
            if not self._pipe_open:
                return
            self._pipe_open = False
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="durable-stream-pg-hints", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        # Under the lock: once the pipe is closed its descriptor numbers may belong to someone else.
        with self._lock, contextlib.suppress(BlockingIOError):  # full: the thread is awake anyway
            if self._pipe_open:
                os.write(self._wake_w, b"\0")

    def _wake_all_watched(self) -> None:
        with self._lock:
            topics = list(self._watched)
            notify = self._notify
            for topic in topics:
                self._watched[topic] = _UNKNOWN
        if notify is not None:
            for topic in topics:
                notify(topic)

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.05
        next_poll = time.monotonic() + self._poll_interval
        next_flush = 0.0
        while not self._closed:
            try:
                if self._conn is None:
                    self._open_connection()
                self._sync_listen()
                now = time.monotonic()
                if now >= next_flush and self._flush():
                    # A hint after a quiet spell goes out at once; under a stream of appends the
                    # next batch waits a moment so that it carries many topics, not one.
                    next_flush = now + HINT_BATCH_GAP
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self._poll_interval
                    self._poll()
                timeout = next_poll - time.monotonic()
                if self._pending:
                    timeout = min(timeout, next_flush - time.monotonic())
                self._wait(max(0.0, timeout))
                backoff = 0.05
            except Exception as exc:  # the thread must survive anything; callers see errors on their own reads
                log.warning("durable-stream PostgreSQL hint connection failed: %s", describe_error(exc))
                self._drop_connection()
                self._wake_all_watched()
                self._sleep(backoff)
                backoff = min(backoff * 2, self._poll_interval)
        if self._conn is not None:
            with contextlib.suppress(Exception):  # best effort: remote readers still have the poll
                self._flush()
        self._drop_connection()
        if self._closed:
            self._close_pipe()

    def _open_connection(self) -> None:
        conn = self._connect()
        conn.add_notify_handler(lambda n: self._dispatch(n.payload, n.pid))
        self._conn = conn
        self._own_pid = conn.info.backend_pid
        self._listening = set()
        with self._lock:
            self._watch_changed = True  # LISTEN again on the new connection
        # Whatever happened while there was no connection went unannounced: look at everything.
        self._wake_all_watched()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        self._listening = set()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _sync_listen(self) -> None:
        conn = self._conn
        assert conn is not None
        with self._lock:
            if not self._watch_changed:
                return
            self._watch_changed = False
            fresh, self._fresh = self._fresh, set()
            wanted = {self.channel(topic) for topic in self._watched} if self._listen else set()
        added = wanted - self._listening
        for channel in sorted(added):
            conn.execute(f"LISTEN {channel}")
            self._listening.add(channel)
        for channel in sorted(self._listening - wanted):
            conn.execute(f"UNLISTEN {channel}")
            self._listening.discard(channel)
        # A change committed between a new subscription's first read and this LISTEN had no
        # listener: wake the newly watched topics once now that hints can no longer be missed.
        if fresh:
            with self._lock:
                notify = self._notify
                fresh &= self._watched.keys()
            if notify is not None:
                for topic in fresh:
                    notify(topic)

    def _flush(self) -> bool:
        """Send the pending hints, if any, in one statement; return whether there were any."""
        conn = self._conn
        assert conn is not None
        with self._lock:
            pending, self._pending = self._pending, set()
        if not pending:
            return False
        topics = sorted(pending)
        try:
            conn.execute(
                "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) AS x(c, p)",
                ([self.channel(topic) for topic in topics], topics),
            )
        except BaseException:
            with self._lock:
                self._pending |= pending
            raise
        return True

    def _poll(self) -> None:
        conn = self._conn
        assert conn is not None
        with self._lock:
            names = list(self._watched)
        if not names:
            return
        current: dict[str, object] = {}
        for start in range(0, len(names), 1000):
            chunk = names[start : start + 1000]
            for name, *state in conn.execute(self._poll_sql, (chunk,)).fetchall():
                current[name] = tuple(state)
        changed = []
        with self._lock:
            for name in names:
                if name not in self._watched:
                    continue
                state = current.get(name)
                if self._watched[name] != state:  # an unknown baseline always counts as a change
                    changed.append(name)
                    self._watched[name] = state
            notify = self._notify
        if notify is not None:
            for name in changed:
                notify(name)

    def _wait(self, timeout: float) -> None:
        conn = self._conn
        assert conn is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            selector.register(conn.pgconn.socket, selectors.EVENT_READ)
            events = selector.select(timeout)
        for key, _ in events:
            if key.fd == self._wake_r:
                self._drain_wake_pipe()
            else:
                pgconn = conn.pgconn
                pgconn.consume_input()
                while (hint := pgconn.notifies()) is not None:
                    self._dispatch(hint.extra.decode("utf-8", "replace"), hint.be_pid)
                if pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the hint connection was closed by the server")

    def _dispatch(self, topic: str, pid: int) -> None:
        # Our own hints were already delivered in-process by the backend object that appended.
        if pid == self._own_pid:
            return
        notify = self._notify
        if notify is not None:
            notify(topic)

    def _sleep(self, seconds: float) -> None:
        """Wait, but return at once on close()."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            selector.select(seconds)
        self._drain_wake_pipe()

    def _drain_wake_pipe(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
