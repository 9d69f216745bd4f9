"""PostgreSQL adapter (SQLAlchemy 2 Core over psycopg 3).

Capability card
---------------
- URL: ``postgresql://user[:password]@host[:port]/database`` (``postgresql+psycopg://`` and
  ``postgres://`` are accepted too). Always psycopg 3, never psycopg2. SQLAlchemy provides the
  URL handling, the connection pool and the admin/retention statements; the three statements every
  append and read runs go straight to the pooled psycopg connection (server-side prepared after a
  few uses), which halves their client-side cost.
- Storage: tables in one schema per store (see :mod:`._postgres_schema`), created on first use
  (idempotent, safe when several processes start at once) or by
  ``python -m api.core.durable_stream._postgres_schema URL --schema NAME``.
- Ordering: an append is one statement (hence one transaction) that increments the topic row's
  ``last_seq`` under its row lock and inserts the record. Appenders of one topic therefore commit in
  ordinal order, so no reader can ever see ordinal ``n + 1`` without ``n``. Ordinals are dense.
- Reads: one statement (one snapshot) returns the topic's head and the next records.
- Durability: whatever the server's ``synchronous_commit``/replication settings give a committed row.
- Wake-ups: after commit, a ``pg_notify`` hint (payload: topic name) on one of ``notify_channels``
  channels hashed from the topic name. One dedicated connection per backend object (outside the pool)
  sends the hints (coalesced) and ``LISTEN``\\ s for other processes' hints; it also re-reads the heads
  of all watched topics every ``poll_interval`` seconds, so a lost hint delays delivery, never loses it.
- Faults: a terminated connection is replaced transparently (idle pooled connections are checked for
  a pending error or EOF at checkout, idempotent reads are retried once on a fresh connection, the
  listening connection reconnects and then wakes every watched topic). A subscription never skips:
  every read restarts from its exact position and the shared core checks every batch's ordinals. When
  the server itself is unreachable, ``connect``/``append``/``receive``/``subscribe_*`` raise
  ``DurableStreamUnavailableError`` (a waiting subscription within about ``poll_interval``).
- Retention: ``max_records`` is applied by every append (the first retained ordinal advances in the
  same statement; rows below it are deleted a few at a time and stragglers by ``enforce_retention``).
  ``admin.enforce_retention()`` applies ``max_records`` and ``max_age_seconds`` in batches of
  ``retention_batch_size`` rows, each its own short transaction that advances ``first_seq`` and
  deletes the prefix together, so appends to the same topic wait for at most one batch. Topics idle
  for longer than ``max_age_seconds`` are deleted once empty.
- Options: ``schema`` (default ``durable_stream``), ``max_records``, ``max_age_seconds``,
  ``buffer_size``, ``pool_size`` (8), ``max_overflow`` (0), ``pool_timeout`` (10 s),
  ``poll_interval`` (1.0 s), ``notify`` (send hints, default true), ``listen`` (receive hints,
  default true), ``notify_channels`` (16), ``create_tables`` (true), ``retention_batch_size`` (1000),
  ``connect_timeout`` (5 s), ``application_name`` (``durable_stream``), ``sslmode``, ``sslrootcert``,
  ``sslcert``, ``sslkey``, ``synchronous_commit`` (the server's default unless given; ``off`` trades
  the last few hundred milliseconds of acknowledged appends on a server crash for throughput).
- Connections per backend object: at most ``pool_size + max_overflow`` pooled ones (opened on demand)
  plus one for hints, however many topics and subscriptions are open. Without overflow the count is
  fixed, so bursts of reads queue for a connection (up to ``pool_timeout``) instead of opening more.
  The queue is served in arrival order (FIFO), so a ``seal()`` behind appenders in a tight loop gets
  its turn, in threads and under gevent.
- gevent: psycopg >= 3.1.14 waits cooperatively when gevent patched ``select`` before psycopg was
  imported; the hint connection's thread is then a greenlet.
- Limits: a server that stops answering without closing its sockets (paused, network partition)
  blocks the calls in flight until TCP gives up; create the backend after forking (pooled connections
  must not cross ``fork()``).
"""

from __future__ import annotations

import _socket
import contextlib
import hashlib
import logging
import os
import selectors
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import sqlalchemy
import sqlalchemy.exc
from sqlalchemy import event, text
from sqlalchemy.engine import Connection, Engine

from ._connect import Options
from ._contract import DurableStreamError, DurableStreamUnavailableError, TopicSealedError
from ._cooperative import Wake
from ._driver import Batch, ChangeFeed, Position, StoredRecord, TopicHead, TopicInfo
from ._fair import FairSemaphore
from ._postgres_schema import ensure_schema, quote_ident, read_identity, validate_schema

__all__ = ["PostgresDriver", "open_driver", "sqlalchemy_url"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_SCHEMES = ("postgresql+psycopg", "postgresql", "postgres")
#: Rows below the first retained ordinal that one append deletes at most; the rest is left to
#: ``enforce_retention`` so that lowering ``max_records`` never makes one append slow.
_APPEND_TRIM_WINDOW = 32
_LIBPQ_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
_CREATE_ATTEMPTS = 5
#: Minimum spacing of hint batches from one process while appends keep coming.
_HINT_BATCH_GAP = 0.002
_SYNCHRONOUS_COMMIT = {"on", "off", "local", "remote_write", "remote_apply"}


def sqlalchemy_url(url: str) -> str:
    """Return ``url`` with the scheme SQLAlchemy needs to pick psycopg 3."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    return f"postgresql+psycopg://{rest}"


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """The one place where driver exceptions become contract errors."""
    try:
        yield
    except DurableStreamError:
        raise
    except (sqlalchemy.exc.SQLAlchemyError, psycopg.Error, OSError) as exc:
        raise DurableStreamUnavailableError(f"PostgreSQL {what} failed: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    original = getattr(exc, "orig", None)
    message = str(original if original is not None else exc).strip().splitlines()
    return f"{type(original or exc).__name__}: {message[0] if message else ''}"


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


class _Sql:
    """The statements of one schema, compiled once."""

    def __init__(self, schema: str, max_records: int | None) -> None:
        s = quote_ident(schema)
        advance = ""
        trim = ""
        if max_records is not None:
            advance = ", first_seq = GREATEST(first_seq, last_seq + 2 - %(max_records)s)"
            trim = f""",
            d AS (
                DELETE FROM {s}.records x USING t
                WHERE x.topic_id = t.id AND x.seq >= t.first_seq - {_APPEND_TRIM_WINDOW} AND x.seq < t.first_seq
            )"""
        # The hot statements (append, head, read) are psycopg-style strings run on the pooled DBAPI
        # connection; the rest are SQLAlchemy ``text()`` constructs.
        #
        # One statement: the UPDATE takes the counter row's lock, which is held until this statement's
        # transaction commits, so appenders of one topic commit in ordinal order.
        self.append = f"""
            WITH t AS (
                UPDATE {s}.topics SET last_seq = last_seq + 1, updated_at = clock_timestamp(){advance}
                WHERE name = %(name)s AND NOT sealed
                RETURNING id, last_seq, first_seq, updated_at
            ), r AS (
                INSERT INTO {s}.records (topic_id, seq, created_at, payload)
                SELECT id, last_seq, updated_at, %(payload)s FROM t
            ){trim}
            SELECT last_seq FROM t"""
        self.create = f"INSERT INTO {s}.topics (name, epoch) VALUES (%(name)s, %(epoch)s) ON CONFLICT (name) DO NOTHING"
        self.head = f"SELECT epoch, first_seq, last_seq, sealed, id FROM {s}.topics WHERE name = %(name)s"
        self.read = f"""
            SELECT t.epoch, t.first_seq, t.last_seq, t.sealed, r.seq, r.payload
            FROM {s}.topics t
            LEFT JOIN LATERAL (
                SELECT seq, payload FROM {s}.records
                WHERE topic_id = t.id AND seq > %(after)s AND seq >= t.first_seq AND seq <= t.last_seq
                ORDER BY seq LIMIT %(limit)s
            ) r ON true
            WHERE t.name = %(name)s
            ORDER BY r.seq"""
        self.seal = text(f"""
            INSERT INTO {s}.topics AS t (name, epoch, sealed) VALUES (:name, :epoch, true)
            ON CONFLICT (name) DO UPDATE SET sealed = true, updated_at = clock_timestamp() WHERE NOT t.sealed""")
        self.head_core = text(f"SELECT epoch, first_seq, last_seq, sealed, id FROM {s}.topics WHERE name = :name")
        # The first retained ordinal moves in the same statement (so the same transaction) as the
        # deletion, and never past the last assigned ordinal.
        self.drop_prefix = text(f"""
            WITH adv AS (
                UPDATE {s}.topics SET first_seq = GREATEST(first_seq, :hi) WHERE id = :id AND last_seq + 1 >= :hi
            )
            DELETE FROM {s}.records WHERE topic_id = :id AND seq >= :lo AND seq < :hi""")
        self.delete_topic = text(f"DELETE FROM {s}.topics WHERE name = :name RETURNING id")
        self.delete_records = text(f"DELETE FROM {s}.records WHERE topic_id = :id")
        self.retention_scan = text(f"""
            SELECT t.id, t.name, t.first_seq, t.last_seq,
                   COALESCE(t.updated_at < now() - make_interval(secs => CAST(:age AS double precision)), false),
                   (SELECT min(seq) FROM {s}.records WHERE topic_id = t.id),
                   COALESCE((SELECT created_at FROM {s}.records
                             WHERE topic_id = t.id AND seq >= t.first_seq ORDER BY seq LIMIT 1)
                            < now() - make_interval(secs => CAST(:age AS double precision)), false)
            FROM {s}.topics t WHERE t.id > :after ORDER BY t.id LIMIT :page""")
        self.first_young = text(f"""
            SELECT seq FROM {s}.records
            WHERE topic_id = :id AND seq >= :first AND created_at >= now() - make_interval(secs => :age)
            ORDER BY seq LIMIT 1""")
        self.delete_idle = text(f"""
            DELETE FROM {s}.topics
            WHERE id = :id AND first_seq > last_seq AND updated_at < now() - make_interval(secs => :age)
            RETURNING id""")
        self.poll = f"SELECT name, epoch, first_seq, last_seq, sealed FROM {s}.topics WHERE name = ANY(%s)"


class PostgresDriver:
    def __init__(self, url: str, options: Options) -> None:
        schema = validate_schema(options.pop_str("schema", "durable_stream") or "")
        self._max_records = options.pop_int("max_records", minimum=1)
        self._max_age = options.pop_float("max_age_seconds", minimum=0.001)
        pool_size = options.pop_int("pool_size", 8, minimum=1)
        max_overflow = options.pop_int("max_overflow", 0, minimum=0)
        pool_timeout = options.pop_float("pool_timeout", 10.0, minimum=0.001)
        fallback_poll = options.pop_float("poll_interval", 1.0, minimum=0.01)
        send_hints = options.pop_bool("notify", True)
        listen = options.pop_bool("listen", True)
        channels = options.pop_int("notify_channels", 16, minimum=1)
        create_tables = options.pop_bool("create_tables", True)
        batch = options.pop_int("retention_batch_size", 1000, minimum=1)
        connect_timeout = options.pop_float("connect_timeout", 5.0, minimum=1.0)
        application_name = options.pop_str("application_name", "durable_stream")
        assert pool_size is not None and max_overflow is not None and pool_timeout is not None
        assert fallback_poll is not None and channels is not None and batch is not None
        assert connect_timeout is not None
        libpq: dict[str, Any] = {
            "connect_timeout": max(1, round(connect_timeout)),
            "application_name": application_name,
            # A peer that vanished without closing (host down, partition) is noticed on idle
            # connections within about a minute instead of never.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        }
        for name in _LIBPQ_OPTIONS:
            value = options.pop_str(name)
            if value is not None:
                libpq[name] = value
        synchronous_commit = options.pop_str("synchronous_commit")
        if synchronous_commit is not None:
            if synchronous_commit not in _SYNCHRONOUS_COMMIT:
                raise ValueError(f"option 'synchronous_commit' must be one of {sorted(_SYNCHRONOUS_COMMIT)}")
            libpq["options"] = f"-c synchronous_commit={synchronous_commit}"

        self._schema = schema
        self._batch = batch
        self._flights: dict[tuple[str, int, int], _Flight] = {}
        self._flights_lock = threading.Lock()
        self._sql = _Sql(schema, self._max_records)
        #: The shared core's own re-read is only a safety net: the hint connection re-reads watched
        #: heads every ``fallback_poll`` seconds and wakes the subscriptions whose topic changed.
        #: Kept long because every idle subscription pays for it: 2,000 subscriptions re-reading
        #: every 15 s is ~130 queries/s, against one query per second for the central poll.
        self.poll_interval = max(15.0, 10 * fallback_poll)
        self._closed = False
        self._turns = FairSemaphore(pool_size + max_overflow)
        self._pool_timeout = pool_timeout

        sa_url = sqlalchemy.make_url(sqlalchemy_url(url))
        self._engine: Engine = sqlalchemy.create_engine(
            sa_url,
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_timeout=pool_timeout,
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
            with _translated("connection"):
                if create_tables:
                    with self._engine.connect() as conn:
                        conn.execution_options(isolation_level="READ COMMITTED")
                        with conn.begin():
                            identity = ensure_schema(conn, schema)
                else:
                    with self._engine.connect() as conn:
                        found = read_identity(conn, schema)
                    if found is None:
                        raise DurableStreamUnavailableError(
                            f"the durable-stream tables do not exist in schema {schema!r}; run "
                            f"`python -m api.core.durable_stream._postgres_schema URL --schema {schema}` "
                            "or connect with create_tables=true"
                        )
                    identity = found
        except BaseException:
            self._engine.dispose()
            raise
        self.identity = f"postgresql:{identity}"
        channel_prefix = "ds_" + hashlib.blake2b(schema.encode(), digest_size=5).hexdigest()
        self._hints = _Hints(
            connect=lambda: psycopg.connect(*args, autocommit=True, **kwargs),
            poll_sql=self._sql.poll,
            channel_prefix=channel_prefix,
            channels=channels,
            send=send_hints,
            listen=listen,
            poll_interval=fallback_poll,
        )

    # -- plumbing -----------------------------------------------------------------------------

    def _run(self, what: str, work: Callable[[Connection], T], *, idempotent: bool = False) -> T:
        """Run ``work`` on a pooled autocommit connection; retry reads once on a replaced connection."""
        self._take_turn(what)
        try:
            attempts = 2 if idempotent else 1
            with _translated(what):
                for attempt in range(1, attempts + 1):
                    try:
                        with self._engine.connect() as conn:
                            return work(conn)
                    except sqlalchemy.exc.DBAPIError as exc:
                        # The pool has already discarded the dead connection; a read is safe to repeat
                        # because the caller's position, not the connection, decides what comes next.
                        if not exc.connection_invalidated or attempt == attempts:
                            raise
                        log.info("retrying PostgreSQL %s on a new connection after: %s", what, _describe(exc))
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
            with _translated(what):
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
                        log.info("retrying PostgreSQL %s on a new connection after: %s", what, _describe(exc))
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
        return TopicHead(epoch=row[0], first=int(row[1]), last=int(row[2]), sealed=bool(row[3]))

    # -- Driver ---------------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes) -> None:
        params = {"name": topic, "payload": payload, "max_records": self._max_records}

        def work(conn: psycopg.Connection[Any]) -> None:
            for _ in range(_CREATE_ATTEMPTS):
                if conn.execute(self._sql.append, params).fetchone() is not None:
                    return
                # Nothing updated: the topic is missing (create it, then append) or sealed.
                conn.execute(self._sql.create, {"name": topic, "epoch": uuid.uuid4().hex})
                row = self._head_row(conn, topic)
                if row is not None and row[3]:
                    raise TopicSealedError(f"topic {topic!r} is sealed")
            raise DurableStreamUnavailableError(f"topic {topic!r} kept disappearing while appending")

        self._raw("append", work)
        self._hints.announce(topic)

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
            records = [
                StoredRecord(ordinal=int(row[4]), native="", payload=bytes(row[5]))
                for row in rows
                if row[4] is not None
            ]
            return Batch(head=self._to_head(rows[0]), records=records)

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
        return TopicInfo(topic, last - first + 1, first, last, bool(row[3]), str(row[0]))

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


class _Feed:
    """The :class:`~._driver.ChangeFeed` view of the hint connection."""

    def __init__(self, hints: _Hints) -> None:
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


class _Hints:
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
        return _Feed(self)

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
                    next_flush = now + _HINT_BATCH_GAP
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self._poll_interval
                    self._poll()
                timeout = next_poll - time.monotonic()
                if self._pending:
                    timeout = min(timeout, next_flush - time.monotonic())
                self._wait(max(0.0, timeout))
                backoff = 0.05
            except Exception as exc:  # the thread must survive anything; callers see errors on their own reads
                log.warning("durable-stream PostgreSQL hint connection failed: %s", _describe(exc))
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


def open_driver(url: str, options: Options) -> PostgresDriver:
    return PostgresDriver(url, options)
