"""The SQLite adapter's change feed: one poller thread per backend object, on ``PRAGMA data_version``."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Final

from ..._cooperative import Wake, run_blocking
from .settings import FEED_MAX_BACKOFF, SqliteSettings

__all__ = ["WATCH_CHUNK", "SqliteChangeFeed"]

#: Topics per statement when the poller reads the watched topics' heads.
WATCH_CHUNK: Final = 500

#: What the poller compares to decide that a watched topic changed: (epoch, first, last, sealed).
_State = tuple[str, int, int, int]


class _Unknown:
    """Baseline of a newly watched topic: its first observed state always counts as a change."""


_UNKNOWN: Final = _Unknown()


class SqliteChangeFeed:
    """The backend's one poller: notices commits by any process through ``PRAGMA data_version``.

    The thread starts with the feed but only polls while at least one topic is watched; otherwise
    it waits on an event. When ``data_version`` moves, it reads the heads of the watched topics and
    notifies those whose (epoch, first, last, sealed) changed or that vanished.
    """

    def __init__(self, settings: SqliteSettings, notify: Callable[[str], None]) -> None:
        self._settings = settings
        self._notify = notify
        self._period = settings.poll_interval
        self._lock = threading.Lock()
        self._watched: dict[str, _State | _Unknown | None] = {}
        self._active = threading.Event()  # set while something is watched, or to wake the thread for close()
        self._stopping = threading.Event()
        #: Number of ``data_version`` checks made so far (tests use it to prove the poller idles).
        self.polls = 0
        self._thread = threading.Thread(target=self._run, name="durable-stream-sqlite-poller", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def watch(self, topic: str) -> None:
        with self._lock:
            self._watched.setdefault(topic, _UNKNOWN)
            self._active.set()

    def unwatch(self, topic: str) -> None:
        with self._lock:
            self._watched.pop(topic, None)
            if not self._watched and not self._stopping.is_set():
                self._active.clear()

    def wait(self, wake: Wake, timeout: float) -> None:
        wake.wait(timeout)

    def close(self) -> None:
        self._stopping.set()
        self._active.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        connection: sqlite3.Connection | None = None
        last_version: int | None = None
        failures = 0
        try:
            while True:
                self._active.wait()
                if self._stopping.is_set():
                    return
                try:
                    if connection is None:
                        connection = run_blocking(self._settings.connect)
                        last_version = None
                    version = run_blocking(functools.partial(_data_version, connection))
                    self.polls += 1
                    if version != last_version:
                        last_version = version
                        self._check(connection)
                    failures = 0
                except (sqlite3.Error, OSError):
                    # Let every subscription re-read: a persistent failure then surfaces as its own
                    # DurableStreamUnavailableError instead of a silent stall.
                    failures += 1
                    if connection is not None:
                        with contextlib.suppress(sqlite3.Error):
                            run_blocking(connection.close)
                    connection = None
                    with self._lock:
                        topics = list(self._watched)
                    self._deliver(topics)
                delay = self._period if failures == 0 else min(self._period * 2**failures, FEED_MAX_BACKOFF)
                if self._stopping.wait(delay):
                    return
        finally:
            if connection is not None:
                with contextlib.suppress(sqlite3.Error):
                    run_blocking(connection.close)

    def _check(self, connection: sqlite3.Connection) -> None:
        with self._lock:
            topics = list(self._watched)
        changed: list[str] = []
        for start in range(0, len(topics), WATCH_CHUNK):
            chunk = topics[start : start + WATCH_CHUNK]
            states = run_blocking(functools.partial(_read_states, connection, chunk))
            with self._lock:
                for topic in chunk:
                    if topic not in self._watched:
                        continue
                    state = states.get(topic)
                    if self._watched[topic] != state:
                        self._watched[topic] = state
                        changed.append(topic)
        self._deliver(changed)

    def _deliver(self, topics: Sequence[str]) -> None:
        for topic in topics:
            with contextlib.suppress(Exception):  # a failing callback must not kill the backend's only poller
                self._notify(topic)


def _data_version(connection: sqlite3.Connection) -> int:
    version: int = connection.execute("PRAGMA data_version").fetchone()[0]
    return version


def _read_states(connection: sqlite3.Connection, topics: Sequence[str]) -> dict[str, _State]:
    marks = ",".join("?" * len(topics))
    rows = connection.execute(
        f"SELECT name, epoch, first_seq, last_seq, sealed FROM topics WHERE name IN ({marks})", tuple(topics)
    ).fetchall()
    return {name: (epoch, first, last, sealed) for name, epoch, first, last, sealed in rows}
