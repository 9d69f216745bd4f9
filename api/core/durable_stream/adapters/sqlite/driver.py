"""The SQLite adapter's driver: one writer connection, a pool of readers, one transaction per call."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Final

from ..._contract import DurableStreamError, DurableStreamUnavailableError, TopicSealedError
from ..._cooperative import run_blocking
from ..._digest import sha1_chain
from ..._driver import Appended, Batch, ChangeFeed, Position, Refused, StoredRecord, TopicHead, TopicInfo
from ..._fair import FairLock, FairSemaphore
from ..._options import Options
from .feed import SqliteChangeFeed
from .settings import REREAD_INTERVAL, SqliteSettings

__all__ = ["SqliteDriver", "open_driver"]


SCHEMA_VERSION: Final = 2
READER_POOL_SIZE: Final = 4
#: Topics per write transaction in ``enforce_retention()``, so other writers get the lock in between.
RETENTION_CHUNK: Final = 100
_SQLITE_BUSY: Final = 5

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS topics (
        id INTEGER PRIMARY KEY,
        name TEXT UNIQUE NOT NULL,
        epoch TEXT NOT NULL,
        first_seq INTEGER NOT NULL,
        last_seq INTEGER NOT NULL,
        sealed INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        last_digest TEXT NOT NULL DEFAULT ''
    )""",
    """CREATE TABLE IF NOT EXISTS records (
        topic_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        created_at REAL NOT NULL,
        payload BLOB NOT NULL,
        digest TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (topic_id, seq)
    ) WITHOUT ROWID""",
)
#: From version 1 (no digests): the records written before keep an unknown digest ('').
_MIGRATE_FROM_1 = (
    "ALTER TABLE topics ADD COLUMN last_digest TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE records ADD COLUMN digest TEXT NOT NULL DEFAULT ''",
)

# Creates the topic with its first record, or bumps the counter of an unsealed one. No row back
# means the topic exists and is sealed.
_APPEND_COUNTER = """
INSERT INTO topics (name, epoch, first_seq, last_seq, sealed, updated_at) VALUES (?, ?, 1, 1, 0, ?)
ON CONFLICT (name) DO UPDATE SET last_seq = last_seq + 1, updated_at = excluded.updated_at WHERE sealed = 0
RETURNING id, first_seq, last_seq, last_digest, epoch
"""
_SEAL = """
INSERT INTO topics (name, epoch, first_seq, last_seq, sealed, updated_at) VALUES (?, ?, 1, 0, 1, ?)
ON CONFLICT (name) DO UPDATE SET sealed = 1, updated_at = excluded.updated_at WHERE sealed = 0
"""
_CREATE = """
INSERT INTO topics (name, epoch, first_seq, last_seq, sealed, updated_at) VALUES (?, ?, 1, 0, 0, ?)
ON CONFLICT (name) DO NOTHING
"""
_HEAD = "SELECT id, epoch, first_seq, last_seq, sealed, last_digest FROM topics WHERE name = ?"

_HeadRow = tuple[int, str, int, int, int, str]


def _new_epoch() -> str:
    return secrets.token_hex(16)


def _guarded[T](what: str, fn: Callable[[], T]) -> T:
    """Run ``fn``, turning every SQLite or file-system failure into a contract error.

    This is the adapter's one translation point: nothing from :mod:`sqlite3` escapes it.
    """
    try:
        return fn()
    except DurableStreamError:
        raise
    except (sqlite3.Error, OSError) as exc:
        raise DurableStreamUnavailableError(f"SQLite {what} failed: {exc}") from exc


def _transaction[T](connection: sqlite3.Connection, begin: str, work: Callable[[sqlite3.Connection], T]) -> T:
    connection.execute(begin)
    try:
        result = work(connection)
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the original error is the one worth reporting
                connection.execute("ROLLBACK")
        raise
    return result


class _ReaderPool:
    """A few reader connections, opened on demand, so reads overlap each other and the writer."""

    def __init__(self, settings: SqliteSettings, size: int) -> None:
        self._settings = settings
        self._slots = FairSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        # The semaphore and lock are taken here, in the calling thread or greenlet; only SQLite
        # work itself goes to the threadpool.
        self._slots.acquire()
        try:
            with self._lock:
                if self._closed:
                    raise DurableStreamUnavailableError("the SQLite backend is closed")
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                connection = run_blocking(self._settings.connect)
            healthy = False
            try:
                yield connection
                healthy = True
            finally:
                with self._lock:
                    keep = healthy and not self._closed
                    if keep:
                        self._idle.append(connection)
                if not keep:
                    # A failed read may have left it mid-transaction; a fresh one is cheap.
                    with contextlib.suppress(sqlite3.Error):
                        run_blocking(connection.close)
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            with contextlib.suppress(sqlite3.Error):
                run_blocking(connection.close)


class SqliteDriver:
    reread_interval = REREAD_INTERVAL
    chain = staticmethod(sha1_chain)

    def __init__(self, settings: SqliteSettings) -> None:
        self._settings = settings
        self._max_records = settings.max_records
        self._max_age = settings.max_age_seconds
        self.identity = f"sqlite:{settings.path}"
        # Fair: with a plain lock under gevent, an appender in a tight loop re-takes it before the
        # greenlet it woke runs, and a waiting seal() never gets it.
        self._write_lock = FairLock()
        self._closed = False
        self._feeds: list[SqliteChangeFeed] = []
        self._feeds_lock = threading.Lock()
        self._writer = self._open_writer()
        self._readers = _ReaderPool(settings, READER_POOL_SIZE)

    # -- connections -------------------------------------------------------------------------

    def _open_writer(self) -> sqlite3.Connection:
        connection = run_blocking(self._settings.connect)
        try:
            self._initialise(connection)
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                run_blocking(connection.close)
            raise
        return connection

    def _initialise(self, connection: sqlite3.Connection) -> None:
        """Switch to WAL and create the schema; safe when several processes open a fresh file at once."""
        deadline = time.monotonic() + self._settings.busy_timeout
        while True:
            try:
                run_blocking(lambda: self._initialise_once(connection))
                return
            except sqlite3.OperationalError as exc:
                # Changing the journal mode can report "locked" without consulting the busy
                # handler while another process is doing the same; retry within busy_timeout.
                if exc.sqlite_errorcode & 0xFF != _SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
            time.sleep(0.01)  # here, not in the threadpool, so that gevent's patched sleep yields

    def _initialise_once(self, connection: sqlite3.Connection) -> None:
        mode = connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise DurableStreamUnavailableError(
                f"SQLite database {self._settings.path!r} cannot use WAL mode (got {mode!r})"
            )
        _transaction(connection, "BEGIN IMMEDIATE", self._create_schema)

    def _create_schema(self, connection: sqlite3.Connection) -> None:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version == 1:
            statements: tuple[str, ...] = _MIGRATE_FROM_1
        elif version == 0:
            statements = _SCHEMA
        else:
            raise DurableStreamUnavailableError(
                f"SQLite database {self._settings.path!r} has schema version {version}, expected {SCHEMA_VERSION}"
            )
        for statement in statements:
            connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _write[T](self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            with self._write_lock:
                if self._closed:
                    raise DurableStreamUnavailableError("the SQLite backend is closed")
                writer = self._writer
                return run_blocking(lambda: _transaction(writer, "BEGIN IMMEDIATE", work))

        return _guarded(what, run)

    def _read[T](self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            if self._closed:
                raise DurableStreamUnavailableError("the SQLite backend is closed")
            with self._readers.connection() as reader:
                return run_blocking(lambda: _transaction(reader, "BEGIN", work))

        return _guarded(what, run)

    # -- Driver ------------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes, expect: Position | None = None) -> Appended | Refused:
        def work(connection: sqlite3.Connection) -> Appended | Refused:
            if expect is not None:
                found: _HeadRow | None = connection.execute(_HEAD, (topic,)).fetchone()
                if found is None and expect.ordinal != 0:
                    return Refused(None)
                if found is not None and (found[3], found[5]) != (expect.ordinal, expect.digest):
                    return Refused(_to_head(found))
            now = time.time()
            # fetchall() steps the RETURNING statement to completion before the next one runs.
            rows = connection.execute(_APPEND_COUNTER, (topic, _new_epoch(), now)).fetchall()
            if not rows:
                raise TopicSealedError(f"topic {topic!r} is sealed")
            topic_id, first, last, previous, epoch = rows[0]
            digest = sha1_chain(previous, payload)
            connection.execute("UPDATE topics SET last_digest = ? WHERE id = ?", (digest, topic_id))
            connection.execute(
                "INSERT INTO records (topic_id, seq, created_at, payload, digest) VALUES (?, ?, ?, ?, ?)",
                (topic_id, last, now, payload, digest),
            )
            if self._max_records is not None and last - first + 1 > self._max_records:
                _drop_prefix(connection, topic_id, first, last - self._max_records + 1)
            return Appended(epoch, last, digest)

        return self._write("append", work)

    def seal(self, topic: str) -> None:
        self._write("seal", lambda c: c.execute(_SEAL, (topic, _new_epoch(), time.time())).close())

    def head(self, topic: str, *, create: bool) -> TopicHead | None:
        row: _HeadRow | None = self._read("head", lambda c: c.execute(_HEAD, (topic,)).fetchone())
        if row is None and create:

            def work(connection: sqlite3.Connection) -> _HeadRow | None:
                connection.execute(_CREATE, (topic, _new_epoch(), time.time()))
                result: _HeadRow | None = connection.execute(_HEAD, (topic,)).fetchone()
                return result

            row = self._write("head", work)
        return None if row is None else _to_head(row)

    def read(self, topic: str, after: Position, limit: int) -> Batch:
        def work(connection: sqlite3.Connection) -> Batch:
            row: _HeadRow | None = connection.execute(_HEAD, (topic,)).fetchone()
            if row is None:
                return Batch(head=None, records=())
            head = _to_head(row)
            if after.ordinal >= head.last or limit <= 0:
                return Batch(head=head, records=())
            rows = connection.execute(
                "SELECT seq, payload, digest FROM records WHERE topic_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (row[0], after.ordinal, limit),
            ).fetchall()
            records = [StoredRecord(seq, "", bytes(payload), digest) for seq, payload, digest in rows]
            return Batch(head=head, records=records)

        return self._read("read", work)

    def topic_info(self, topic: str) -> TopicInfo | None:
        row: _HeadRow | None = self._read("topic_info", lambda c: c.execute(_HEAD, (topic,)).fetchone())
        if row is None:
            return None
        _, epoch, first, last, sealed, digest = row
        return TopicInfo(topic, last - first + 1, first, last, bool(sealed), epoch, digest)

    def trim(self, topic: str, keep_last: int) -> int:
        def work(connection: sqlite3.Connection) -> int:
            row: _HeadRow | None = connection.execute(_HEAD, (topic,)).fetchone()
            if row is None:
                return 0
            topic_id, _, first, last, _, _ = row
            return _drop_prefix(connection, topic_id, first, last - keep_last + 1)

        return self._write("trim", work)

    def delete(self, topic: str) -> bool:
        def work(connection: sqlite3.Connection) -> bool:
            row = connection.execute("SELECT id FROM topics WHERE name = ?", (topic,)).fetchone()
            if row is None:
                return False
            connection.execute("DELETE FROM records WHERE topic_id = ?", row)
            connection.execute("DELETE FROM topics WHERE id = ?", row)
            return True

        return self._write("delete", work)

    def enforce_retention(self) -> int:
        removed = 0
        if self._max_records is not None:
            removed += self._retain_last(self._max_records)
        if self._max_age is not None:
            cutoff = time.time() - self._max_age
            removed += self._expire_topics(cutoff)
            removed += self._expire_records(cutoff)
        return removed

    def _retain_last(self, max_records: int) -> int:
        """Trim topics left over the limit (for example by a process configured with a larger one)."""

        def work(connection: sqlite3.Connection) -> tuple[int, bool]:
            rows = connection.execute(
                "SELECT id, first_seq, last_seq FROM topics WHERE last_seq - first_seq + 1 > ? LIMIT ?",
                (max_records, RETENTION_CHUNK),
            ).fetchall()
            count = sum(_drop_prefix(connection, tid, first, last - max_records + 1) for tid, first, last in rows)
            return count, len(rows) == RETENTION_CHUNK

        return self._in_chunks("retention", work)

    def _expire_topics(self, cutoff: float) -> int:
        """Delete whole topics idle since before ``cutoff``; a re-created one gets a new epoch."""

        def work(connection: sqlite3.Connection) -> tuple[int, bool]:
            rows = connection.execute(
                "SELECT id, first_seq, last_seq FROM topics WHERE updated_at < ? LIMIT ?", (cutoff, RETENTION_CHUNK)
            ).fetchall()
            count = 0
            for topic_id, first, last in rows:
                connection.execute("DELETE FROM records WHERE topic_id = ?", (topic_id,))
                connection.execute("DELETE FROM topics WHERE id = ?", (topic_id,))
                count += last - first + 1
            return count, len(rows) == RETENTION_CHUNK

        return self._in_chunks("retention", work)

    def _expire_records(self, cutoff: float) -> int:
        """Drop each live topic's prefix of records created before ``cutoff``."""
        after_id = 0

        def work(connection: sqlite3.Connection) -> tuple[int, bool]:
            nonlocal after_id
            # Only topics whose first retained record is old: one primary-key probe per topic.
            rows = connection.execute(
                "SELECT t.id, t.first_seq, t.last_seq FROM topics AS t "
                "JOIN records AS r ON r.topic_id = t.id AND r.seq = t.first_seq "
                "WHERE t.id > ? AND r.created_at < ? ORDER BY t.id LIMIT ?",
                (after_id, cutoff, RETENTION_CHUNK),
            ).fetchall()
            count = 0
            for topic_id, first, last in rows:
                # Scans only the expired prefix (in seq order) and stops at the first young record,
                # so what is removed is always a prefix even if clocks stepped backwards.
                young = connection.execute(
                    "SELECT seq FROM records WHERE topic_id = ? AND seq >= ? AND created_at >= ? ORDER BY seq LIMIT 1",
                    (topic_id, first, cutoff),
                ).fetchone()
                count += _drop_prefix(connection, topic_id, first, last + 1 if young is None else young[0])
            if rows:
                after_id = rows[-1][0]
            return count, len(rows) == RETENTION_CHUNK

        return self._in_chunks("retention", work)

    def _in_chunks(self, what: str, work: Callable[[sqlite3.Connection], tuple[int, bool]]) -> int:
        total = 0
        more = True
        while more:
            count, more = self._write(what, work)
            total += count
        return total

    def open_change_feed(self, notify: Callable[[str], None]) -> ChangeFeed | None:
        with self._feeds_lock:
            if self._closed:
                return None
            feed = SqliteChangeFeed(self._settings, notify)
            self._feeds.append(feed)
        return feed

    def close(self) -> None:
        with self._feeds_lock:
            feeds, self._feeds = self._feeds, []
        for feed in feeds:
            feed.close()
        with self._write_lock:  # waits for an in-flight write to finish before closing its connection
            if self._closed:
                return
            self._closed = True
            writer = self._writer
        self._readers.close()
        with contextlib.suppress(sqlite3.Error):
            run_blocking(writer.close)


def _to_head(row: _HeadRow) -> TopicHead:
    _, epoch, first, last, sealed, digest = row
    return TopicHead(epoch=epoch, first=first, last=last, sealed=bool(sealed), last_digest=digest)


def _drop_prefix(connection: sqlite3.Connection, topic_id: int, first: int, new_first: int) -> int:
    """Delete records ``first .. new_first - 1`` and advance ``first_seq``, in the caller's transaction."""
    if new_first <= first:
        return 0
    removed = connection.execute(
        "DELETE FROM records WHERE topic_id = ? AND seq >= ? AND seq < ?", (topic_id, first, new_first)
    ).rowcount
    connection.execute("UPDATE topics SET first_seq = ? WHERE id = ?", (new_first, topic_id))
    return removed


def open_driver(url: str, options: Options) -> SqliteDriver:
    settings = SqliteSettings.from_url(url, options)
    # Reject unknown options before touching the file system.
    options.ensure_consumed("sqlite")

    def resolve() -> str:
        absolute = os.path.abspath(settings.path)
        os.makedirs(os.path.dirname(absolute), exist_ok=True)
        return os.path.realpath(absolute)

    resolved = dataclasses.replace(settings, path=_guarded("open", resolve))
    return _guarded("open", lambda: SqliteDriver(resolved))
