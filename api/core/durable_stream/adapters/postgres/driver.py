"""The PostgreSQL adapter's driver: pooled connections, the statements of a topic, retention."""

from __future__ import annotations

import _socket
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
import sqlalchemy
import sqlalchemy.exc
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from ..._contract import DurableStreamUnavailableError, TopicSealedError
from ..._digest import sha256_chain
from ..._driver import Appended, Batch, ChangeFeed, Position, Refused, StoredRecord, TopicHead, TopicInfo
from ..._fair import FairSemaphore
from ..._options import Options
from .errors import describe_error, translated
from .feed import HintConnection
from .schema import SCHEMA_VERSION, ensure_schema, read_identity, read_version
from .settings import PostgresSettings, sqlalchemy_url
from .sql import Statements

__all__ = ["PostgresDriver", "open_driver"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_CREATE_ATTEMPTS = 5


def _socket_has_input(fd: int) -> bool:
    """Whether an idle connection's socket has something to read: an error report, or EOF.

    The unpatched ``_socket`` module is used on purpose: gevent's socket would wait on EAGAIN.
    """
    sock = _socket.socket(fileno=fd)
    try:
        sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.detach()
    return True


class PostgresDriver:
    #: What the append statement computes with ``sha256()``.
    chain = staticmethod(sha256_chain)

    def __init__(self, settings: PostgresSettings) -> None:
        schema = settings.schema
        self._max_records = settings.max_records
        self._max_age = settings.max_age_seconds
        batch = settings.retention_batch_size
        libpq = settings.libpq_params()
        self._schema = schema
        self._batch = batch
        self._flights: dict[tuple[str, int, int], _Flight] = {}
        self._flights_lock = threading.Lock()
        self._sql = Statements(schema, self._max_records)
        #: The shared core's own re-read is only a safety net: the hint connection re-reads watched
        #: heads every ``poll_interval`` seconds and wakes the subscriptions whose topic changed.
        #: Kept long because every idle subscription pays for it: 2,000 subscriptions re-reading
        #: every 15 s is ~130 queries/s, against one query per second for the central poll.
        self.reread_interval = max(15.0, 10 * settings.poll_interval)
        self._closed = False
        self._turns = FairSemaphore(settings.pool_size + settings.max_overflow)
        self._pool_timeout = settings.pool_timeout

        sa_url = sqlalchemy.make_url(sqlalchemy_url(settings.url))
        self._engine: Engine = sqlalchemy.create_engine(
            sa_url,
            pool_size=settings.pool_size,
            max_overflow=settings.max_overflow,
            pool_timeout=settings.pool_timeout,
            connect_args=dict(libpq),
            isolation_level="AUTOCOMMIT",
        )
        event.listen(self._engine, "checkout", _check_idle_connection)
        args, kwargs = self._engine.dialect.create_connect_args(sa_url)
        kwargs.pop("context", None)
        kwargs.update(libpq)
        # A hint needs no durability: not waiting for its commit record's flush keeps the hint
        # connection's transactions cheap and out of the appenders' way.
        kwargs["options"] = "-c synchronous_commit=off"
        try:
            with translated("connection"):
                command = f"`python -m api.core.durable_stream.adapters.postgres.schema URL --schema {schema}`"
                if settings.create_tables:
                    with self._engine.connect() as conn:
                        conn.execution_options(isolation_level="READ COMMITTED")
                        with conn.begin():
                            identity = ensure_schema(conn, schema)
                            version = read_version(conn, schema)
                else:
                    with self._engine.connect() as conn:
                        found = read_identity(conn, schema)
                        version = read_version(conn, schema)
                    if found is None:
                        raise DurableStreamUnavailableError(
                            f"the durable-stream tables do not exist in schema {schema!r}; run {command} "
                            "or connect with create_tables=true"
                        )
                    identity = found
                if version != SCHEMA_VERSION:
                    raise DurableStreamUnavailableError(
                        f"the durable-stream tables in schema {schema!r} are of schema version {version}, this "
                        f"library needs {SCHEMA_VERSION}; run {command} (it upgrades version 1 in place) or "
                        "connect with create_tables=true"
                    )
        except BaseException:
            self._engine.dispose()
            raise
        self.identity = f"postgresql:{identity}"
        channel_prefix = "ds_" + hashlib.blake2b(schema.encode(), digest_size=5).hexdigest()
        self._hints = HintConnection(
            connect=lambda: psycopg.connect(*args, autocommit=True, **kwargs),
            poll_sql=self._sql.poll,
            channel_prefix=channel_prefix,
            channels=settings.notify_channels,
            send=settings.send_hints,
            listen=settings.listen,
            poll_interval=settings.poll_interval,
        )

    # -- plumbing -----------------------------------------------------------------------------

    def _run(self, what: str, work: Callable[[Connection], T], *, idempotent: bool = False) -> T:
        """Run ``work`` on a pooled autocommit connection; retry reads once on a replaced connection."""
        self._take_turn(what)
        try:
            attempts = 2 if idempotent else 1
            with translated(what):
                for attempt in range(1, attempts + 1):
                    try:
                        with self._engine.connect() as conn:
                            return work(conn)
                    except sqlalchemy.exc.DBAPIError as exc:
                        # The pool has already discarded the dead connection; a read is safe to repeat
                        # because the caller's position, not the connection, decides what comes next.
                        if not exc.connection_invalidated or attempt == attempts:
                            raise
                        log.info("retrying PostgreSQL %s on a new connection after: %s", what, describe_error(exc))
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._turns.release()

    def _raw(self, what: str, work: Callable[[psycopg.Connection[Any]], T], *, idempotent: bool = False) -> T:
        """Run ``work`` on a pooled connection's psycopg object, bypassing SQLAlchemy's execution layer.

        Used by the statements every append and read runs: it roughly halves their client-side
        cost. The pool, its checkout check and the error translation stay the same as :meth:`_run`.
        """
        self._take_turn(what)
        try:
            attempts = 2 if idempotent else 1
            with translated(what):
                for attempt in range(1, attempts + 1):
                    pooled = self._engine.raw_connection()
                    conn: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
                    try:
                        if not conn.autocommit:  # pragma: no cover - the engine hands out autocommit connections
                            conn.autocommit = True
                        return work(conn)
                    except psycopg.Error as exc:
                        if not (conn.broken or conn.closed):
                            raise
                        pooled.invalidate(exc)
                        if attempt == attempts:
                            raise
                        log.info("retrying PostgreSQL %s on a new connection after: %s", what, describe_error(exc))
                    finally:
                        pooled.close()
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._turns.release()

    def _take_turn(self, what: str) -> None:
        """Wait for a pooled connection in arrival order; release the turn once it is back in the pool.

        SQLAlchemy's pool queue lets a caller that returns a connection and at once asks again take
        it before the waiter it woke runs; under gevent that starves the waiter (a seal behind
        appenders) until ``pool_timeout``. With no more turns than connections, the pool itself
        never makes a turn's holder wait.
        """
        if self._closed:
            raise DurableStreamUnavailableError("the PostgreSQL driver is closed")
        if not self._turns.acquire(timeout=self._pool_timeout):
            raise DurableStreamUnavailableError(
                f"PostgreSQL {what} failed: no pooled connection became free within {self._pool_timeout:g} s"
            )

    def _head_row(self, conn: psycopg.Connection[Any], topic: str) -> Sequence[Any] | None:
        return conn.execute(self._sql.head, {"name": topic}).fetchone()

    @staticmethod
    def _to_head(row: Sequence[Any]) -> TopicHead:
        """A head from ``epoch, first_seq, last_seq, sealed, id, last_digest`` (the ``head`` statement's row)."""
        return TopicHead(epoch=row[0], first=int(row[1]), last=int(row[2]), sealed=bool(row[3]), last_digest=row[5])

    # -- Driver ---------------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes, expect: Position | None = None) -> Appended | Refused:
        params: dict[str, Any] = {"name": topic, "payload": payload, "max_records": self._max_records}
        statement = self._sql.append
        if expect is not None:
            statement = self._sql.append_if
            params["last"], params["digest"] = expect.ordinal, expect.digest

        def work(conn: psycopg.Connection[Any]) -> Appended | Refused:
            for _ in range(_CREATE_ATTEMPTS):
                stored = conn.execute(statement, params).fetchone()
                if stored is not None:
                    return Appended(str(stored[2]), int(stored[0]), str(stored[1]))
                # Nothing updated: the topic is missing (create it, then append), sealed, or not at the
                # expected head.
                row = self._head_row(conn, topic)
                if row is not None and expect is not None and (int(row[2]), row[5]) != (expect.ordinal, expect.digest):
                    return Refused(self._to_head(row))
                if row is not None and row[3]:
                    raise TopicSealedError(f"topic {topic!r} is sealed")
                if row is None:
                    if expect is not None and expect.ordinal != 0:
                        return Refused(None)
                    conn.execute(self._sql.create, {"name": topic, "epoch": uuid.uuid4().hex})
            raise DurableStreamUnavailableError(f"topic {topic!r} kept disappearing while appending")

        appended = self._raw("append", work)
        if isinstance(appended, Appended):
            self._hints.announce(topic)
        return appended

    def seal(self, topic: str) -> None:
        self._run(
            "seal",
            lambda conn: conn.execute(self._sql.seal, {"name": topic, "epoch": uuid.uuid4().hex}),
            idempotent=True,
        )
        self._hints.announce(topic)

    def head(self, topic: str, *, create: bool) -> TopicHead | None:
        def work(conn: psycopg.Connection[Any]) -> TopicHead | None:
            row = self._head_row(conn, topic)
            if row is None and create:
                conn.execute(self._sql.create, {"name": topic, "epoch": uuid.uuid4().hex})
                row = self._head_row(conn, topic)
            return None if row is None else self._to_head(row)

        return self._raw("head", work, idempotent=True)

    def read(self, topic: str, after: Position, limit: int) -> Batch:
        """One query per distinct read waiting at the same moment, shared by all who asked for it.

        Subscriptions of one topic woken by the same append ask for the same thing (same position,
        same limit). A caller joins a query only while it has not been sent yet, so the snapshot it
        gets was taken after it asked: sharing never hands anyone an older view than its own query
        would have. When the pool is busy, the leader's wait for a connection gathers more joiners.
        """
        key = (topic, after.ordinal, limit)
        with self._flights_lock:
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        if not leader:
            flight.done.wait()
            if flight.batch is None:
                raise DurableStreamUnavailableError(f"PostgreSQL read failed: {flight.error}") from flight.error
            return flight.batch

        def work(conn: psycopg.Connection[Any]) -> Batch:
            with self._flights_lock:
                if self._flights.get(key) is flight:  # later callers start a query of their own
                    del self._flights[key]
            rows = conn.execute(self._sql.read, {"name": topic, "after": after.ordinal, "limit": limit}).fetchall()
            if not rows:
                return Batch(head=None, records=())
            records = [StoredRecord(int(row[4]), "", bytes(row[5]), row[7]) for row in rows if row[4] is not None]
            first = rows[0]
            head = TopicHead(first[0], int(first[1]), int(first[2]), bool(first[3]), last_digest=first[6])
            return Batch(head=head, records=records)

        try:
            # Let the other subscriptions woken by the same hint run first and join this read
            # (under gevent they are ready greenlets; in threads this only gives up the GIL).
            time.sleep(0)
            flight.batch = self._raw("read", work, idempotent=True)
            return flight.batch
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._flights_lock:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            flight.done.set()

    def topic_info(self, topic: str) -> TopicInfo | None:
        row = self._raw("topic_info", lambda conn: self._head_row(conn, topic), idempotent=True)
        if row is None:
            return None
        first, last = int(row[1]), int(row[2])
        return TopicInfo(topic, last - first + 1, first, last, bool(row[3]), str(row[0]), str(row[5]))

    def trim(self, topic: str, keep_last: int) -> int:
        def work(conn: Connection) -> int:
            row = conn.execute(self._sql.head_core, {"name": topic}).first()
            if row is None:
                return 0
            first, last, topic_id = int(row[1]), int(row[2]), int(row[4])
            target = last - keep_last + 1
            if target <= first:
                return 0
            self._drop_prefix(conn, topic_id, first, target)
            return target - first

        removed = self._run("trim", work)
        self._hints.announce(topic)
        return removed

    def delete(self, topic: str) -> bool:
        def work(conn: Connection) -> bool:
            # Two statements in one transaction: the second one's snapshot is taken after the topic
            # row's lock was won, so it also sees a record whose appender committed just before.
            conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                row = conn.execute(self._sql.delete_topic, {"name": topic}).first()
                if row is None:
                    return False
                conn.execute(self._sql.delete_records, {"id": row[0]})
                return True

        existed = self._run("delete", work)
        self._hints.announce(topic)
        return existed

    def _drop_prefix(self, conn: Connection, topic_id: int, low: int, target: int) -> None:
        """Delete ordinals ``[low, target)`` in short transactions, advancing ``first_seq`` with each."""
        while low < target:
            high = min(target, low + self._batch)
            conn.execute(self._sql.drop_prefix, {"id": topic_id, "lo": low, "hi": high})
            low = high

    def enforce_retention(self) -> int:
        if self._max_records is None and self._max_age is None:
            return 0
        changed: list[str] = []

        def work(conn: Connection) -> int:
            removed = 0
            after = 0
            while True:
                rows = conn.execute(self._sql.retention_scan, {"age": self._max_age, "after": after, "page": 500}).all()
                if not rows:
                    return removed
                for topic_id, name, first, last, idle, low, aged in rows:
                    after = topic_id
                    target = first
                    if self._max_records is not None:
                        target = max(target, last - self._max_records + 1)
                    if aged and self._max_age is not None:
                        young = conn.execute(
                            self._sql.first_young, {"id": topic_id, "first": first, "age": self._max_age}
                        ).scalar()
                        target = max(target, last + 1 if young is None else int(young))
                    low = first if low is None else min(int(low), first)
                    if low < target:
                        self._drop_prefix(conn, topic_id, low, target)
                    if target > first:
                        removed += target - first
                        changed.append(name)
                    if idle and target > last and self._max_age is not None:
                        gone = conn.execute(self._sql.delete_idle, {"id": topic_id, "age": self._max_age}).first()
                        if gone is not None:
                            conn.execute(self._sql.delete_records, {"id": topic_id})
                            changed.append(name)

        try:
            return self._run("enforce_retention", work)
        finally:
            for name in changed:
                self._hints.announce(name, local=True)

    def open_change_feed(self, notify: Callable[[str], None]) -> ChangeFeed | None:
        return self._hints.open_feed(notify)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._hints.close()
        self._engine.dispose()


def _check_idle_connection(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    """Hand out no connection the server has already closed (restart, ``pg_terminate_backend``).

    An idle connection has nothing to read unless the server sent an error or closed it, so a
    zero-timeout peek replaces a ``SELECT 1`` round trip per checkout.
    """
    conn: psycopg.Connection[Any] = dbapi_connection
    if conn.closed or conn.broken:
        raise sqlalchemy.exc.DisconnectionError("connection closed")
    # Under TLS the socket may carry protocol records that are not a PostgreSQL message, and a
    # false alarm would discard every connection: there a dead connection is found by its call.
    tls = getattr(conn.pgconn, "ssl_in_use", True)  # unknown to older psycopg: assume TLS, skip the peek
    if not tls and _socket_has_input(conn.pgconn.socket):
        raise sqlalchemy.exc.DisconnectionError("connection closed by the server while idle")


class _Flight:
    """One read query and the callers waiting for its result."""

    __slots__ = ("batch", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.batch: Batch | None = None
        self.error: BaseException | None = None


def open_driver(url: str, options: Options) -> PostgresDriver:
    return PostgresDriver(PostgresSettings.from_url(url, options))
