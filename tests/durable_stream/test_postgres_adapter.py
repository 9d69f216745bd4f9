"""PostgreSQL adapter specifics, against the shared server at 127.0.0.1:5432 (database ``test``).

Every test works in a schema of its own (dropped afterwards) or with uuid topic names, so runs never
collide. Faults that need the server stopped or killed live in ``test_postgres_faults.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamRecord,
    DurableStreamSubscription,
    DurableStreamUnavailableError,
    connect,
)
from api.core.durable_stream.testing.helpers import drain
from harness.services import POSTGRES_DSN
from harness.waiting import wait_until
from tests.durable_stream import hooks

SHARED_URL = POSTGRES_DSN
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def engine() -> Iterator[sqlalchemy.Engine]:
    eng = sqlalchemy.create_engine(SHARED_URL.replace("postgresql://", "postgresql+psycopg://"))
    yield eng
    eng.dispose()


@pytest.fixture
def schema(engine: sqlalchemy.Engine) -> Iterator[str]:
    name = f"ds_test_{uuid.uuid4().hex[:12]}"
    yield name
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def backend_defaults(schema: str) -> dict[str, Any]:
    return {"schema": schema}


def _name() -> str:
    return f"pg-{uuid.uuid4().hex}"


def _run_python(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _connection_count(engine: sqlalchemy.Engine, application_name: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sqlalchemy.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                {"a": application_name},
            ).scalar_one()
        )


# -- connecting ------------------------------------------------------------------------------------


def test_every_url_form_reaches_the_same_store(open_backend: Callable[..., DurableStreamBackend]) -> None:
    name = _name()
    first = open_backend(SHARED_URL)
    first.topic(name).append(b"one")
    for url in (
        SHARED_URL.replace("postgresql://", "postgres://"),
        SHARED_URL.replace("postgresql://", "postgresql+psycopg://"),
        SHARED_URL.replace("postgresql://", "POSTGRESQL://"),
    ):
        other = open_backend(url)
        assert hooks.identity(other) == hooks.identity(first)
        info = other.admin.topic_info(name)
        assert info is not None and info.last_ordinal == 1


def test_options_from_the_query_string_and_unknown_options(schema: str) -> None:
    with connect(f"{SHARED_URL}?schema={schema}&max_records=2&buffer_size=4") as backend:
        topic = backend.topic(_name())
        for index in range(5):
            topic.append(str(index).encode())
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 2, timeout=20)] == [b"3", b"4"]
    with pytest.raises(ValueError, match="unknown option"):
        connect(SHARED_URL, schema=schema, no_such_option=1)
    with pytest.raises(ValueError, match="schema"):
        connect(SHARED_URL, schema="bad name; drop table x")
    with pytest.raises(ValueError, match="synchronous_commit"):
        connect(SHARED_URL, schema=schema, synchronous_commit="sometimes")


def test_importing_the_library_needs_neither_psycopg_nor_sqlalchemy() -> None:
    result = _run_python(
        """
        import sys
        import api.core.durable_stream
        loaded = [name for name in ("psycopg", "sqlalchemy") if name in sys.modules]
        assert not loaded, loaded
        """
    )
    assert result.returncode == 0, result.stderr


def test_processes_starting_at_once_create_the_tables_once(schema: str, engine: sqlalchemy.Engine) -> None:
    start_at = time.time() + 1.5
    script = """
        import sys, time
        from api.core.durable_stream import connect
        from tests.durable_stream import hooks
        url, schema, start_at, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
        while time.time() < start_at:  # deliberate timing: every process starts at the same moment
            time.sleep(0.001)
        with connect(url, schema=schema) as backend:
            for index in range(5):
                backend.topic("shared").append(f"{name}-{index}".encode())
            print(hooks.identity(backend))
        """
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), SHARED_URL, schema, str(start_at), f"child{i}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outputs = [process.communicate(timeout=60) for process in processes]
    for process, (_, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
    assert len({stdout.strip() for stdout, _ in outputs}) == 1, "every process must see the same store identity"
    with engine.connect() as conn:
        seqs = conn.exec_driver_sql(f'SELECT seq FROM "{schema}".records ORDER BY seq').scalars().all()
    assert seqs == list(range(1, 21))


def test_migration_command_and_create_tables_false(schema: str, open_backend: Callable[..., Any]) -> None:
    with pytest.raises(DurableStreamUnavailableError, match=r"adapters\.postgres\.schema"):
        open_backend(create_tables=False)
    printed = subprocess.run(
        [sys.executable, "-m", "api.core.durable_stream.adapters.postgres.schema", "--print-sql", "--schema", schema],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f'CREATE TABLE IF NOT EXISTS "{schema}".records' in printed.stdout
    for _ in range(2):  # idempotent
        migrated = subprocess.run(
            [sys.executable, "-m", "api.core.durable_stream.adapters.postgres.schema", SHARED_URL, "--schema", schema],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert migrated.returncode == 0, migrated.stderr
    backend = open_backend(create_tables=False)
    topic = backend.topic(_name())
    topic.append(b"after migration")
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 1, timeout=20)] == [b"after migration"]


VERSION_1_DDL = """
CREATE SCHEMA "{s}";
CREATE TABLE "{s}".topics (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL UNIQUE, epoch text NOT NULL,
    first_seq bigint NOT NULL DEFAULT 1, last_seq bigint NOT NULL DEFAULT 0, sealed boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(), CHECK (first_seq >= 1 AND first_seq <= last_seq + 1)
);
CREATE TABLE "{s}".records (
    topic_id bigint NOT NULL, seq bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload bytea NOT NULL, PRIMARY KEY (topic_id, seq)
);
CREATE TABLE "{s}".meta (key text PRIMARY KEY, value text NOT NULL);
INSERT INTO "{s}".meta VALUES ('identity', 'old-store'), ('schema_version', '1');
INSERT INTO "{s}".topics (name, epoch, last_seq) VALUES ('t', 'e1', 2);
INSERT INTO "{s}".records (topic_id, seq, payload) SELECT id, 1, 'a' FROM "{s}".topics;
INSERT INTO "{s}".records (topic_id, seq, payload) SELECT id, 2, 'b' FROM "{s}".topics;
"""


def test_a_version_1_store_is_upgraded_in_place(
    schema: str, engine: sqlalchemy.Engine, open_backend: Callable[..., Any]
) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(VERSION_1_DDL.format(s=schema))
    # Without create_tables the adapter does not change the tables itself: it says what to run.
    with pytest.raises(DurableStreamUnavailableError, match=r"schema version 1.*adapters\.postgres\.schema"):
        open_backend(create_tables=False)
    backend = open_backend()
    assert hooks.identity(backend) == "postgresql:old-store"  # the same store: its cursors stay valid
    topic = backend.topic("t")
    topic.append(b"c")
    with topic.subscribe_from_beginning() as subscription:
        records = drain(subscription, 3, timeout=20)
    assert [r.payload for r in records] == [b"a", b"b", b"c"]
    digests = [backend.admin.cursor_position("t", r.cursor).digest for r in records]
    assert digests[:2] == ["", ""] and len(digests[2]) == 16
    with topic.subscribe_from_cursor(records[0].cursor) as resumed:
        assert [r.payload for r in drain(resumed, 2, timeout=20)] == [b"b", b"c"]
    with engine.connect() as conn:
        version = conn.exec_driver_sql(f"""SELECT value FROM "{schema}".meta WHERE key = 'schema_version'""").scalar()
    assert version == "2"
    open_backend(create_tables=False)  # upgraded: no DDL needed any more


def test_database_errors_surface_only_as_contract_errors(
    open_backend: Callable[..., DurableStreamBackend], schema: str, engine: sqlalchemy.Engine
) -> None:
    backend = open_backend()
    topic = backend.topic(_name())
    topic.append(b"x")
    subscription = topic.subscribe_from_beginning()
    subscription.__enter__()
    assert drain(subscription, 1, timeout=20)[0].payload == b"x"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    with pytest.raises(DurableStreamUnavailableError) as caught:
        topic.append(b"y")
    assert type(caught.value) is DurableStreamUnavailableError
    assert "UndefinedTable" in str(caught.value)
    with pytest.raises(DurableStreamUnavailableError):
        backend.admin.topic_info(topic.name)  # type: ignore[attr-defined]
    with pytest.raises(DurableStreamUnavailableError):
        while subscription.receive(timeout=2.0) is not CLOSED:
            pass
    assert subscription.receive(timeout=0) is CLOSED


def test_large_and_binary_payloads_round_trip(open_backend: Callable[..., DurableStreamBackend]) -> None:
    topic = open_backend().topic(_name())
    payloads = [b"", bytes(range(256)) * 4, os.urandom(4 * 1024 * 1024)]
    for payload in payloads:
        topic.append(payload)
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 3, timeout=20)] == payloads


# -- ordering ----------------------------------------------------------------------------------------


def test_commit_order_equals_ordinal_order_with_slow_committers(
    open_backend: Callable[..., DurableStreamBackend], schema: str, engine: sqlalchemy.Engine
) -> None:
    """16 appending threads, some of whose transactions stay open for a while after taking their
    ordinal; 4 live subscriptions (2 on another backend object, woken only by NOTIFY/poll) must each
    see ordinals 1..N with no gap, in the order the database assigned."""
    writer = open_backend(pool_size=16, max_overflow=0)
    reader = open_backend()
    name = _name()
    writer.topic(name).append(b"seed")
    # Hold some appending transactions open after they took the topic row's lock and their
    # ordinal: a design that assigned ordinals outside that lock would let later ordinals commit first.
    with engine.begin() as conn:
        conn.exec_driver_sql(f"""
            CREATE FUNCTION "{schema}".hold_open() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF random() < 0.08 THEN PERFORM pg_sleep(0.02 + random() * 0.08); END IF;
                RETURN NEW;
            END $$""")
        conn.exec_driver_sql(
            f'CREATE TRIGGER hold_open BEFORE INSERT ON "{schema}".records '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".hold_open()'
        )
    threads_count, per_thread = 16, 40
    total = 1 + threads_count * per_thread
    subscriptions = [
        writer.topic(name).subscribe_from_beginning(),
        writer.topic(name).subscribe_from_beginning(),
        reader.topic(name).subscribe_from_beginning(),
        reader.topic(name).subscribe_from_beginning(),
    ]
    for subscription in subscriptions:
        subscription.__enter__()
    results: list[list[DurableStreamRecord]] = [[] for _ in subscriptions]
    errors: list[BaseException] = []

    def consume(index: int) -> None:
        try:
            results[index] = drain(subscriptions[index], total, timeout=90)
        except BaseException as exc:
            errors.append(exc)

    def produce(thread: int) -> None:
        try:
            topic = writer.topic(name)
            for item in range(per_thread):
                topic.append(f"{thread}:{item}".encode())
        except BaseException as exc:
            errors.append(exc)

    consumers = [threading.Thread(target=consume, args=(i,)) for i in range(len(subscriptions))]
    producers = [threading.Thread(target=produce, args=(i,)) for i in range(threads_count)]
    for thread in consumers + producers:
        thread.start()
    for thread in consumers + producers:
        thread.join(120)
    for subscription in subscriptions:
        subscription.close()
    assert not errors, errors
    with engine.connect() as conn:
        stored = conn.exec_driver_sql(f'SELECT payload FROM "{schema}".records ORDER BY seq').scalars().all()
    assert len(stored) == total
    codec = hooks.cursor_codec(writer, name)
    for records in results:
        ordinals = [codec.decode(r.cursor).position.ordinal for r in records]
        assert ordinals == list(range(1, total + 1))
        assert [r.payload for r in records] == [bytes(p) for p in stored]
    per_producer: dict[str, list[int]] = {}
    for payload in stored[1:]:
        thread_id, item = bytes(payload).decode().split(":")
        per_producer.setdefault(thread_id, []).append(int(item))
    assert all(items == list(range(per_thread)) for items in per_producer.values())


# -- wake-ups ----------------------------------------------------------------------------------------


def test_notify_wakes_a_subscription_of_another_backend_quickly(
    open_backend: Callable[..., DurableStreamBackend],
) -> None:
    writer = open_backend()
    poll_interval = 30.0  # the fallback poll cannot be what delivers
    reader = open_backend(poll_interval=poll_interval)
    name = _name()
    delays = []
    with reader.topic(name).subscribe_from_tail() as subscription:
        for index in range(20):
            started = time.monotonic()
            writer.topic(name).append(str(index).encode())
            record = drain(subscription, 1, timeout=poll_interval / 2)[0]
            delays.append(time.monotonic() - started)
            assert record.payload == str(index).encode()
    # Each woken by its NOTIFY: well before the fallback poll could have found it (the figures of how
    # quickly are docs/benchmarks.md's, measured on a quiet machine).
    assert max(delays) < poll_interval / 2, delays


@pytest.mark.parametrize("reader_listens", [True, False], ids=["hints-lost", "listen-off"])
def test_without_notifications_every_record_still_arrives(
    open_backend: Callable[..., DurableStreamBackend], reader_listens: bool
) -> None:
    writer = open_backend(notify=False)
    reader = open_backend(listen=reader_listens, poll_interval=0.3)
    reread = hooks.driver(reader).reread_interval
    name = _name()
    delays: list[float] = []
    with reader.topic(name).subscribe_from_tail() as subscription:
        for index in range(8):
            started = time.monotonic()
            writer.topic(name).append(str(index).encode())
            assert drain(subscription, 1, timeout=reread / 2)[0].payload == str(index).encode()
            delays.append(time.monotonic() - started)
        writer.topic(name).seal()
        assert subscription.receive(timeout=reread / 2) is CLOSED
    # Delivered by the fallback poll (every 0.3 s here), not by the core's own much slower
    # safety-net re-read.
    assert max(delays) < reread / 2, delays


def test_gevent_blocked_receives_do_not_stop_other_greenlets(schema: str) -> None:
    result = _run_python(
        """
        from gevent import monkey
        monkey.patch_all()
        import sys, time, uuid
        import gevent
        from api.core.durable_stream import connect

        url, schema = sys.argv[1], sys.argv[2]
        # A receive that blocked the hub would stop every greenlet for a poll interval at least (up to
        # its timeout); a loaded machine's scheduler alone does not stop this process for that long.
        poll = 1.0
        backend = connect(url, schema=schema, poll_interval=poll)
        writer = connect(url, schema=schema)
        names = [uuid.uuid4().hex for _ in range(50)]
        subscriptions = [backend.topic(name).subscribe_from_tail() for name in names]
        for subscription in subscriptions:
            subscription.__enter__()

        def receive(subscription):
            return subscription.receive(timeout=3.0)

        ticks = []
        def tick():
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                ticks.append(time.monotonic())
                gevent.sleep(0.01)  # pacing: the 10 ms ticker whose lateness shows a blocked hub

        def produce():
            gevent.sleep(0.5)  # deliberate timing: append while the readers block in receive()
            for name in names[:10]:
                writer.topic(name).append(name.encode())

        receivers = [gevent.spawn(receive, s) for s in subscriptions]
        ticker = gevent.spawn(tick)
        producer = gevent.spawn(produce)
        gevent.joinall(receivers + [ticker, producer], timeout=20, raise_error=True)
        got = [g.value for g in receivers]
        delivered = [r.payload.decode() for r in got[:10]]
        assert delivered == names[:10], delivered
        assert all(r is None for r in got[10:]), got[10:]
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        assert ticks[-1] - ticks[0] > 2.5 - poll, (ticks[0], ticks[-1])
        assert max(gaps) < poll, max(gaps)
        import psycopg.waiting
        assert psycopg.waiting.wait is not psycopg.waiting.wait_c
        backend.close()
        writer.close()
        print("ok", len(ticks), round(max(gaps), 3))
        """,
        SHARED_URL,
        schema,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok"), result.stdout


def test_many_subscriptions_share_a_bounded_number_of_connections(
    open_backend: Callable[..., DurableStreamBackend], engine: sqlalchemy.Engine
) -> None:
    application_name = f"ds-conn-{uuid.uuid4().hex[:8]}"
    backend = open_backend(application_name=application_name, pool_size=4)
    writer = open_backend()
    names = [_name() for _ in range(20)]
    subscriptions = [backend.topic(names[i % 20]).subscribe_from_tail() for i in range(200)]
    for subscription in subscriptions:
        subscription.__enter__()
    received: list[bytes] = []
    lock = threading.Lock()

    def consume(subscription: DurableStreamSubscription) -> None:
        record = drain(subscription, 1, timeout=30)[0]
        with lock:
            received.append(record.payload)

    threads = [threading.Thread(target=consume, args=(s,)) for s in subscriptions]
    for thread in threads:
        thread.start()
    peak = 0
    for name in names:
        writer.topic(name).append(name.encode())
        peak = max(peak, _connection_count(engine, application_name))
    for thread in threads:
        thread.join(60)
    peak = max(peak, _connection_count(engine, application_name))
    assert sorted(received) == sorted(name.encode() for name in names for _ in range(10))
    assert peak <= 4 + 1, peak  # the pool plus the one hint connection
    for subscription in subscriptions:
        subscription.close()


# -- retention ---------------------------------------------------------------------------------------


def test_max_records_is_applied_by_every_append(
    open_backend: Callable[..., DurableStreamBackend], schema: str, engine: sqlalchemy.Engine
) -> None:
    backend = open_backend(max_records=3)
    name = _name()
    topic = backend.topic(name)
    for index in range(50):
        topic.append(str(index).encode())
    info = backend.admin.topic_info(name)
    assert info is not None and (info.first_ordinal, info.last_ordinal, info.length) == (48, 50, 3)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f'SELECT count(*) FROM "{schema}".records').scalar_one()
    assert rows == 3
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 3, timeout=20)] == [b"47", b"48", b"49"]


def _bulk_old_records(engine: sqlalchemy.Engine, schema: str, name: str, count: int, age_seconds: float) -> None:
    """Give topic ``name`` ``count`` records that are ``age_seconds`` old, the way appends would have."""
    with engine.begin() as conn:
        topic_id = conn.exec_driver_sql(
            f'UPDATE "{schema}".topics SET last_seq = last_seq + %(n)s WHERE name = %(name)s RETURNING id',
            {"n": count, "name": name},
        ).scalar_one()
        conn.exec_driver_sql(
            f"""INSERT INTO "{schema}".records (topic_id, seq, created_at, payload)
                SELECT %(id)s, g, now() - make_interval(secs => %(age)s), decode(repeat('ab', 100), 'hex')
                FROM generate_series(1, %(n)s) AS g""",
            {"id": topic_id, "n": count, "age": age_seconds},
        )


def test_enforce_retention_works_in_batches_without_stalling_appends(
    open_backend: Callable[..., DurableStreamBackend], schema: str, engine: sqlalchemy.Engine
) -> None:
    backend = open_backend(max_age_seconds=3600, retention_batch_size=500)
    name, other = _name(), _name()
    backend.topic(name).subscribe_from_tail().close()  # creates the empty topic
    old = 50_000
    _bulk_old_records(engine, schema, name, old, age_seconds=7200)
    # Deleting is fast here; slow it down (2 ms per 50 rows, ~2 s in all) so that removing the
    # prefix in one transaction would visibly stall appends to the topic, and batches would not.
    with engine.begin() as conn:
        conn.exec_driver_sql(f"""
            CREATE FUNCTION "{schema}".slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF OLD.seq %% 50 = 0 THEN PERFORM pg_sleep(0.002); END IF;
                RETURN OLD;
            END $$""")
        conn.exec_driver_sql(
            f'CREATE TRIGGER slow_delete BEFORE DELETE ON "{schema}".records '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".slow_delete()'
        )
    backend.topic(other).append(b"young")
    stale = backend.topic(name).subscribe_from_beginning()
    stale.__enter__()
    assert drain(stale, 1, timeout=20)[0].payload == bytes.fromhex("ab" * 100)

    latencies: list[float] = []
    stop = threading.Event()
    appended: list[bytes] = []

    firsts: set[int] = set()

    def append_meanwhile() -> None:
        topic = backend.topic(name)
        index = 0
        while not stop.is_set():
            payload = f"new-{index}".encode()
            started = time.monotonic()
            topic.append(payload)
            latencies.append(time.monotonic() - started)
            appended.append(payload)
            index += 1

    def watch_first_ordinal() -> None:
        while not stop.is_set():
            info = backend.admin.topic_info(name)
            assert info is not None
            firsts.add(info.first_ordinal)
            time.sleep(0.01)  # pacing: sample the first retained ordinal every 10 ms

    helpers = [threading.Thread(target=append_meanwhile), threading.Thread(target=watch_first_ordinal)]
    for helper in helpers:
        helper.start()
    try:
        wait_until(lambda: len(appended) >= 10, timeout=10.0, what="the appender to be appending")
        started = time.monotonic()
        removed = backend.admin.enforce_retention()
        took = time.monotonic() - started
    finally:
        stop.set()
        for helper in helpers:
            helper.join(30)
    assert removed == old
    # Committed batch by batch: other connections saw the first retained ordinal move in steps.
    assert len(firsts - {1, old + 1}) >= 10, sorted(firsts)
    assert all((first - 1) % 500 == 0 for first in firsts), sorted(firsts)
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(f"retention of {old} rows took {took:.2f}s; {len(latencies)} appends meanwhile, p99 {p99 * 1000:.1f} ms")
    assert took > 1.0, "the slowed-down deletion should take a while"
    assert len(latencies) > 50
    # No append waited for the removal as a whole (one transaction would have held them all that long).
    assert latencies[-1] < took / 2, (latencies[-5:], took)
    info = backend.admin.topic_info(name)
    assert info is not None and info.first_ordinal == old + 1 and info.length == len(appended)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f'SELECT count(*) FROM "{schema}".records r JOIN "{schema}".topics t ON t.id = r.topic_id '
            "WHERE t.name = %(n)s",
            {"n": name},
        ).scalar_one()
    assert rows == len(appended)
    with pytest.raises(CursorUnavailableError):  # the reader left at ordinal 1 must not skip ahead
        while stale.receive(timeout=2.0) is not None:
            pass
    with backend.topic(name).subscribe_from_beginning() as fresh:
        assert [r.payload for r in drain(fresh, len(appended), timeout=20)] == appended
    info_other = backend.admin.topic_info(other)
    assert info_other is not None and info_other.length == 1


def test_idle_topics_are_deleted_and_stragglers_cleaned(
    open_backend: Callable[..., DurableStreamBackend], schema: str, engine: sqlalchemy.Engine
) -> None:
    backend = open_backend(max_age_seconds=60, max_records=10)
    idle, busy = _name(), _name()
    backend.topic(idle).seal()
    _bulk_old_records(engine, schema, idle, 25, age_seconds=120)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE \"{schema}\".topics SET updated_at = now() - interval '2 minutes' WHERE name = %(n)s",
            {"n": idle},
        )
    for index in range(15):
        backend.topic(busy).append(str(index).encode())
    # Rows below the first retained ordinal that an append did not get to (here: left by hand).
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'UPDATE "{schema}".topics SET first_seq = 12 WHERE name = %(n)s',
            {"n": busy},
        )
    assert backend.admin.enforce_retention() == 25
    assert backend.admin.topic_info(idle) is None
    info = backend.admin.topic_info(busy)
    assert info is not None and (info.first_ordinal, info.last_ordinal) == (12, 15)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f'SELECT seq FROM "{schema}".records ORDER BY seq').scalars().all()
    assert rows == [12, 13, 14, 15]
