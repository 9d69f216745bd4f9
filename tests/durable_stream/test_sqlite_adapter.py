"""SQLite-specific behaviour: files, processes, the data_version poller, gevent, and error mapping.

The shared contract suite (``test_contract_sqlite.py``) covers the stream semantics; these tests
cover what only this adapter has. Every database is a fresh file under ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import pathlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamRecord,
    DurableStreamSubscription,
    DurableStreamUnavailableError,
    connect,
)
from harness.waiting import wait_until
from tests.durable_stream import hooks

PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[2]
POLLER_NAME = "durable-stream-sqlite-poller"


def _url(path: pathlib.Path) -> str:
    return f"sqlite:///{path}"


def _python(script: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    """Start a separate OS process running ``script`` from the project root (never under gevent)."""
    env = dict(os.environ)
    env.pop("GEVENT_SUPPORT", None)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str], timeout: float = 60) -> str:
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"child failed ({process.returncode}):\n{stderr}"
    return stdout


def _receive(subscription: DurableStreamSubscription, timeout: float) -> DurableStreamRecord:
    result = subscription.receive(timeout=timeout)
    assert isinstance(result, DurableStreamRecord), f"expected a record, got {result!r}"
    return result


@pytest.fixture
def db(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "streams.db"


@pytest.fixture
def backend(db: pathlib.Path) -> Iterator[DurableStreamBackend]:
    with connect(_url(db)) as opened:
        yield opened


# -- URLs, options, schema ----------------------------------------------------------------------


def test_absolute_and_relative_urls_create_parent_directories(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absolute = tmp_path / "a" / "b" / "abs.db"
    with connect(f"sqlite:///{absolute}") as backend:
        backend.topic("t").append(b"x")
        assert hooks.identity(backend) == f"sqlite:{os.path.realpath(absolute)}"
    assert absolute.is_file()

    monkeypatch.chdir(tmp_path)
    with connect("sqlite:///rel/dir/rel.db") as backend:
        backend.topic("t").append(b"x")
        assert hooks.identity(backend) == f"sqlite:{os.path.realpath(tmp_path / 'rel' / 'dir' / 'rel.db')}"
    assert (tmp_path / "rel" / "dir" / "rel.db").is_file()


def test_identity_is_the_resolved_path(tmp_path: pathlib.Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with (
        connect(_url(tmp_path / "real" / "s.db")) as direct,
        connect(_url(tmp_path / "link" / ".." / "link" / "s.db")) as via_link,
    ):
        assert hooks.identity(direct) == hooks.identity(via_link)
        # Same identity means a cursor from one backend object resumes on the other.
        direct.topic("t").append(b"r0")
        direct.topic("t").append(b"r1")
        with direct.topic("t").subscribe_from_beginning() as subscription:
            cursor = _receive(subscription, 1.0).cursor
        with via_link.topic("t").subscribe_from_cursor(cursor) as resumed:
            assert _receive(resumed, 1.0).payload == b"r1"


@pytest.mark.parametrize("url", ["sqlite://host/x.db", "sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_bad_urls_are_value_errors(url: str) -> None:
    with pytest.raises(ValueError):
        connect(url)


@pytest.mark.parametrize(
    "options",
    [
        {"no_such_option": 1},
        {"synchronous": "off"},
        {"synchronous": "extra-safe"},
        {"busy_timeout": "soon"},
        {"busy_timeout": -1},
        {"poll_interval": 0},
        {"max_records": 0},
        {"max_age_seconds": "old"},
    ],
)
def test_invalid_options_are_value_errors_before_the_file_is_touched(
    db: pathlib.Path, options: dict[str, object]
) -> None:
    with pytest.raises(ValueError):
        connect(_url(db), **options)
    assert not db.exists()


def test_options_from_the_query_string(db: pathlib.Path) -> None:
    with connect(f"{_url(db)}?max_records=2&synchronous=NORMAL&busy_timeout=1.5&poll_interval=0.2") as backend:
        assert hooks.sqlite_pragma(backend, "synchronous") == 1  # NORMAL
        assert hooks.sqlite_settings(backend).busy_timeout == 1.5
        assert hooks.sqlite_settings(backend).poll_interval == 0.2
        topic = backend.topic("t")
        for index in range(5):
            topic.append(b"%d" % index)
        info = backend.admin.topic_info("t")
        assert info is not None and (info.first_ordinal, info.last_ordinal, info.length) == (4, 5, 2)
    with pytest.raises(ValueError, match="unknown option"):
        connect(f"{_url(db)}?maxrecords=2")


def test_durable_by_default_in_wal_mode_with_the_documented_schema(
    backend: DurableStreamBackend, db: pathlib.Path
) -> None:
    assert hooks.sqlite_pragma(backend, "synchronous") == 2  # FULL
    assert hooks.sqlite_driver(backend).reread_interval == pytest.approx(15.0)
    check = sqlite3.connect(db)
    try:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert check.execute("PRAGMA user_version").fetchone()[0] == 2
        topics = [row[1] for row in check.execute("PRAGMA table_info(topics)")]
        records = [row[1] for row in check.execute("PRAGMA table_info(records)")]
    finally:
        check.close()
    assert topics == ["id", "name", "epoch", "first_seq", "last_seq", "sealed", "updated_at", "last_digest"]
    assert records == ["topic_id", "seq", "created_at", "payload", "digest"]


VERSION_1_SCHEMA = (
    "CREATE TABLE topics (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, epoch TEXT NOT NULL, "
    "first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, sealed INTEGER NOT NULL, updated_at REAL NOT NULL)",
    "CREATE TABLE records (topic_id INTEGER NOT NULL, seq INTEGER NOT NULL, created_at REAL NOT NULL, "
    "payload BLOB NOT NULL, PRIMARY KEY (topic_id, seq)) WITHOUT ROWID",
)


def test_a_version_1_database_is_migrated_and_its_topics_go_on(db: pathlib.Path) -> None:
    # A database of the previous release: two records without digests.
    old = sqlite3.connect(db)
    try:
        old.execute("PRAGMA journal_mode = WAL")
        for statement in VERSION_1_SCHEMA:
            old.execute(statement)
        old.execute("INSERT INTO topics VALUES (1, 't', 'e1', 1, 2, 0, 0)")
        old.execute("INSERT INTO records VALUES (1, 1, 0, x'61'), (1, 2, 0, x'62')")
        old.execute("PRAGMA user_version = 1")
        old.commit()
    finally:
        old.close()
    with connect(_url(db)) as backend:
        topic = backend.topic("t")
        topic.append(b"c")
        with topic.subscribe_from_beginning() as subscription:
            records = [subscription.receive(timeout=5) for _ in range(3)]
        payloads = [r.payload for r in records if isinstance(r, DurableStreamRecord)]
        assert payloads == [b"a", b"b", b"c"]
        digests = [
            backend.admin.cursor_position("t", r.cursor).digest for r in records if isinstance(r, DurableStreamRecord)
        ]
        # The old records' digests are unknown (their cursors resume by ordinal); the new one's is known.
        assert digests[:2] == ["", ""] and len(digests[2]) == 16
        assert isinstance(records[0], DurableStreamRecord)
        with topic.subscribe_from_cursor(records[0].cursor) as resumed:
            again = [resumed.receive(timeout=5) for _ in range(2)]
        assert [r.payload for r in again if isinstance(r, DurableStreamRecord)] == [b"b", b"c"]
    check = sqlite3.connect(db)
    try:
        assert check.execute("PRAGMA user_version").fetchone()[0] == 2
    finally:
        check.close()


def test_binary_payloads_round_trip(backend: DurableStreamBackend) -> None:
    topic = backend.topic("binary")
    items = [b"", b"\x00\xff\x00", os.urandom(1 << 20)]
    for item in items:
        topic.append(item)
    with topic.subscribe_from_beginning() as subscription:
        assert [_receive(subscription, 1.0).payload for _ in items] == items


# -- error mapping ------------------------------------------------------------------------------


def _assert_translated(error: DurableStreamUnavailableError) -> None:
    assert not isinstance(error, sqlite3.Error)
    assert isinstance(error.__cause__, sqlite3.Error | OSError)


def test_a_corrupt_file_is_unavailable(db: pathlib.Path) -> None:
    db.write_bytes(b"this is not an SQLite database, just bytes " * 200)
    with pytest.raises(DurableStreamUnavailableError) as caught:
        connect(_url(db))
    _assert_translated(caught.value)


def test_an_unusable_path_is_unavailable(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "plain-file"
    blocker.write_text("not a directory")
    with pytest.raises(DurableStreamUnavailableError) as caught:
        connect(_url(blocker / "sub" / "s.db"))
    _assert_translated(caught.value)

    directory = tmp_path / "a-directory.db"
    directory.mkdir()
    with pytest.raises(DurableStreamUnavailableError) as caught:
        connect(_url(directory))
    _assert_translated(caught.value)


def test_a_foreign_schema_version_is_unavailable(db: pathlib.Path) -> None:
    other = sqlite3.connect(db)
    other.execute("PRAGMA user_version = 7")
    other.close()
    with pytest.raises(DurableStreamUnavailableError, match="schema version 7"):
        connect(_url(db))


def test_failures_after_opening_are_translated(backend: DurableStreamBackend, db: pathlib.Path) -> None:
    topic = backend.topic("t")
    topic.append(b"r0")
    subscription = topic.subscribe_from_beginning()
    subscription.__enter__()
    vandal = sqlite3.connect(db)
    vandal.execute("DROP TABLE records")
    vandal.execute("DROP TABLE topics")
    vandal.close()
    with pytest.raises(DurableStreamUnavailableError) as caught:
        topic.append(b"r1")
    _assert_translated(caught.value)
    with pytest.raises(DurableStreamUnavailableError) as caught:
        while subscription.receive(timeout=2.0) is not CLOSED:
            pass
    _assert_translated(caught.value)
    assert subscription.receive(timeout=0) is CLOSED


def test_a_writer_lock_held_past_busy_timeout_is_unavailable(db: pathlib.Path) -> None:
    busy_timeout = 0.2
    with connect(_url(db), busy_timeout=busy_timeout) as backend:
        topic = backend.topic("t")
        topic.append(b"r0")
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            started = time.monotonic()
            with pytest.raises(DurableStreamUnavailableError) as caught:
                topic.append(b"r1")
            # It waited out the busy timeout, and then gave up instead of waiting on.
            assert 0.75 * busy_timeout < time.monotonic() - started < 25 * busy_timeout
            _assert_translated(caught.value)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        topic.append(b"r1")  # the writer connection is usable again
        info = backend.admin.topic_info("t")
        assert info is not None and info.last_ordinal == 2


# -- retention ----------------------------------------------------------------------------------


def _age(db: pathlib.Path, seconds: float) -> None:
    """Make every stored record and topic look ``seconds`` older, instead of sleeping that long."""
    connection = sqlite3.connect(db, isolation_level=None)
    try:
        connection.execute("UPDATE records SET created_at = created_at - ?", (seconds,))
        connection.execute("UPDATE topics SET updated_at = updated_at - ?", (seconds,))
    finally:
        connection.close()


def test_max_age_drops_old_prefixes_and_idle_topics(db: pathlib.Path) -> None:
    with connect(_url(db), max_age_seconds=60) as backend:
        idle, busy = backend.topic("idle"), backend.topic("busy")
        for index in range(3):
            idle.append(b"i%d" % index)
            busy.append(b"b%d" % index)
        with idle.subscribe_from_beginning() as subscription:
            idle_cursor = _receive(subscription, 1.0).cursor
        _age(db, 120)
        busy.append(b"b3")  # keeps "busy" active; its three old records still expire
        assert backend.admin.enforce_retention() == 6
        assert backend.admin.topic_info("idle") is None
        info = backend.admin.topic_info("busy")
        assert info is not None and (info.first_ordinal, info.last_ordinal, info.length) == (4, 4, 1)
        # The idle topic was deleted with its metadata: a new incarnation refuses the old cursor.
        idle.append(b"again")
        with pytest.raises(CursorUnavailableError):
            subscription = idle.subscribe_from_cursor(idle_cursor)
            subscription.__enter__()
        assert backend.admin.enforce_retention() == 0


def test_enforce_retention_applies_max_records_left_by_another_configuration(db: pathlib.Path) -> None:
    with connect(_url(db)) as unlimited, connect(_url(db), max_records=3) as limited:
        topic = unlimited.topic("t")
        for index in range(10):
            topic.append(b"%d" % index)
        assert limited.admin.enforce_retention() == 7
        info = limited.admin.topic_info("t")
        assert info is not None and (info.first_ordinal, info.last_ordinal, info.length) == (8, 10, 3)


# -- the change feed ----------------------------------------------------------------------------


CHILD_APPENDER = """
    import random, sys, time
    from api.core.durable_stream import connect
    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with connect(url) as backend:
        topic = backend.topic(name)
        print("ready", flush=True)
        for index in range(count):
            time.sleep(random.uniform(0.0, 0.03))
            topic.append(f"{index} {time.time()!r}".encode())
            print(f"{index} {time.time()!r}", flush=True)
"""


def test_another_process_appends_are_delivered_in_order_by_the_poller(db: pathlib.Path) -> None:
    count = 60
    with connect(_url(db)) as backend:
        reread = hooks.sqlite_driver(backend).reread_interval
        name = f"cross-{uuid.uuid4().hex}"
        with backend.topic(name).subscribe_from_tail() as subscription:
            child = _python(CHILD_APPENDER, _url(db), name, str(count))
            received: list[tuple[bytes, float]] = []
            deadline = time.monotonic() + 60
            while len(received) < count:
                assert time.monotonic() < deadline, f"received {len(received)} of {count}"
                result = subscription.receive(timeout=0.5)
                assert result is not CLOSED
                if result is not None:
                    received.append((result.payload, time.time()))
            output = _finish(child)
    returned = {int(index): float(at) for index, at in (line.split() for line in output.splitlines()[1:])}
    assert [int(payload.split()[0]) for payload, _ in received] == list(range(count))
    lags = [seen_at - returned[index] for index, (_, seen_at) in enumerate(received)]
    # Each found by the poller (every 0.05 s), none left to the subscription's last-resort re-read.
    assert max(lags) < reread / 2, f"slowest delivery took {max(lags):.3f}s after the append returned"


def test_changes_through_another_connection_wake_subscriptions_before_the_fallback_poll(db: pathlib.Path) -> None:
    # Two backend objects in one process share nothing but the file: only the poller can tell
    # the first one's subscriptions about the second one's writes.
    with connect(_url(db)) as watcher, connect(_url(db)) as writer:
        reread = hooks.sqlite_driver(watcher).reread_interval
        topic = watcher.topic("t")
        topic.append(b"r0")
        with topic.subscribe_from_beginning() as sealed_one, topic.subscribe_from_beginning() as deleted_one:
            assert _receive(sealed_one, 1.0).payload == b"r0"
            assert _receive(deleted_one, 1.0).payload == b"r0"
            assert sealed_one.receive(timeout=0.2) is None
            writer.topic("t").seal()
            started = time.monotonic()
            assert sealed_one.receive(timeout=reread / 2) is CLOSED
            assert time.monotonic() - started < reread / 2

            writer.admin.delete_topic("t")
            started = time.monotonic()
            with pytest.raises(CursorUnavailableError):
                while deleted_one.receive(timeout=reread / 2) is not CLOSED:
                    pass
            assert time.monotonic() - started < reread / 2


def _poller_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == POLLER_NAME]


def test_the_poller_idles_without_watched_topics_and_costs_little_with_them(db: pathlib.Path) -> None:
    already = set(_poller_threads())
    with connect(_url(db)) as backend:
        topic = backend.topic("t")
        topic.append(b"r0")
        assert hooks.sqlite_feed(backend) is None and set(_poller_threads()) == already, (
            "started before any subscription"
        )

        with topic.subscribe_from_tail() as subscription:
            feed = hooks.sqlite_feed(backend)
            assert feed is not None and feed.thread.is_alive()
            polls = feed.polls
            cpu = time.process_time()
            wall = time.monotonic()
            while time.monotonic() - wall < 1.0:
                assert subscription.receive(timeout=1.0 - (time.monotonic() - wall)) is None
            spent = time.process_time() - cpu
            checks = feed.polls - polls
        assert spent < 0.2, f"an idle subscription cost {spent:.3f}s of CPU in one second"
        assert 5 <= checks <= 40, f"{checks} data_version checks in one second at a 0.05 s period"

        # No topic watched: the thread waits on an event and stops polling.
        wait_until(lambda: not hooks.sqlite_feed_polling(feed), timeout=5, what="the poller to park")
        settled = feed.polls
        time.sleep(0.3)
        assert feed.polls == settled
        thread = feed.thread

        started = time.monotonic()
    assert not thread.is_alive()
    assert time.monotonic() - started < 1.0


def test_close_stops_the_poller_without_waiting_out_its_period(db: pathlib.Path) -> None:
    backend = connect(_url(db), poll_interval=30)
    topic = backend.topic("t")
    subscription = topic.subscribe_from_tail()
    subscription.__enter__()
    feed = hooks.sqlite_feed(backend)
    assert feed is not None
    wait_until(lambda: feed.polls >= 1, timeout=5, what="a first poll")
    started = time.monotonic()
    backend.close()
    assert time.monotonic() - started < 30 / 2
    assert not feed.thread.is_alive()
    assert subscription.receive(timeout=0) is CLOSED
    backend.close()


# -- processes and gevent -----------------------------------------------------------------------


CHILD_CONCURRENT_OPEN = """
    import sys, time
    from api.core.durable_stream import connect
    url, start_at, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    while time.time() < start_at:
        time.sleep(0.001)
    with connect(url) as backend:
        for index in range(5):
            backend.topic("shared").append(f"{name}-{index}".encode())
            backend.topic(name).append(b"mine")
"""


@pytest.mark.parametrize("round_", range(3))
def test_processes_opening_a_fresh_file_at_once_create_the_schema_once(tmp_path: pathlib.Path, round_: int) -> None:
    db = tmp_path / f"fresh-{round_}" / "streams.db"
    start_at = time.time() + 1.0  # past every child's interpreter start-up
    children = [_python(CHILD_CONCURRENT_OPEN, _url(db), repr(start_at), f"child{n}") for n in range(4)]
    for child in children:
        _finish(child)
    with connect(_url(db)) as backend:
        info = backend.admin.topic_info("shared")
        assert info is not None and (info.first_ordinal, info.last_ordinal, info.length) == (1, 20, 20)
        for n in range(4):
            mine = backend.admin.topic_info(f"child{n}")
            assert mine is not None and mine.length == 5
    check = sqlite3.connect(db)
    try:
        tables = sorted(row[0] for row in check.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        assert tables == ["records", "topics"]
        assert check.execute("PRAGMA user_version").fetchone()[0] == 2
    finally:
        check.close()


CHILD_CURSOR_MAKER = """
    import sys
    from api.core.durable_stream import connect
    with connect(sys.argv[1]) as backend:
        topic = backend.topic("handover")
        for index in range(3):
            topic.append(b"r%d" % index)
        with topic.subscribe_from_beginning() as subscription:
            print(subscription.receive(timeout=5).cursor)
"""


def test_a_cursor_made_in_another_process_resumes_here(db: pathlib.Path) -> None:
    cursor = _finish(_python(CHILD_CURSOR_MAKER, _url(db))).strip()
    with connect(_url(db)) as backend, backend.topic("handover").subscribe_from_cursor(cursor) as resumed:  # type: ignore[arg-type]
        assert [_receive(resumed, 1.0).payload for _ in range(2)] == [b"r1", b"r2"]


GEVENT_CHILD = """
    from gevent import monkey

    monkey.patch_all()

    import json, subprocess, sys, time

    import gevent

    from api.core.durable_stream import CLOSED, connect
    from api.core.durable_stream._cooperative import gevent_active

    assert gevent_active()
    path, holder_script = sys.argv[1], sys.argv[2]
    stats = {"lateness": 0.0, "ticks": 0, "slowest_append": 0.0, "appended": 0, "in_order": True, "received": 0}
    finished = False

    def ticker():
        expected = time.monotonic() + 0.01
        while not finished:
            gevent.sleep(0.01)
            now = time.monotonic()
            stats["lateness"] = max(stats["lateness"], now - expected)
            stats["ticks"] += 1
            expected = now + 0.01

    with connect("sqlite:///" + path, synchronous="full") as backend:
        topic = backend.topic("gevent")
        subscription = topic.subscribe_from_tail()
        subscription.__enter__()

        def appender():
            # Another process takes the write lock repeatedly: our appends wait in SQLite's busy
            # handler, a C-level sleep that would freeze every greenlet if it ran on the hub.
            holder = subprocess.Popen([sys.executable, "-c", holder_script, path])
            index = 0
            while holder.poll() is None or index < 100:
                started = time.monotonic()
                topic.append(b"%d" % index)
                stats["slowest_append"] = max(stats["slowest_append"], time.monotonic() - started)
                index += 1
            stats["appended"] = index
            topic.seal()

        def reader():
            expected = 0
            while (record := subscription.receive(timeout=1.0)) is not CLOSED:
                if record is not None:
                    stats["in_order"] &= int(record.payload) == expected
                    expected += 1
            stats["received"] = expected

        tick = gevent.spawn(ticker)
        gevent.joinall([gevent.spawn(appender), gevent.spawn(reader)], raise_error=True, timeout=60)
        finished = True
        tick.join()
        subscription.close()
    print(json.dumps(stats))
"""

#: How long the lock holder keeps the database locked each time: an append waits about that long, and a
#: hub blocked by the wait would hold the ticker up as long.
LOCK_HOLD = 1.0
LOCK_HOLDER = f"""
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
for _ in range(3):
    time.sleep(0.1)
    connection.execute("BEGIN IMMEDIATE")
    time.sleep({LOCK_HOLD})
    connection.execute("COMMIT")
"""


def test_under_gevent_sqlite_calls_never_block_the_hub(db: pathlib.Path) -> None:
    with connect(_url(db)):  # create the file and schema so the lock holder has something to lock
        pass
    stats = json.loads(_finish(_python(GEVENT_CHILD, str(db), LOCK_HOLDER), timeout=90))
    assert stats["received"] == stats["appended"] >= 100 and stats["in_order"]
    assert stats["slowest_append"] >= LOCK_HOLD / 2, f"the lock holder never made an append wait: {stats}"
    assert stats["ticks"] > 50
    # Had the wait run on the hub, the 10 ms ticker would have been late by the whole wait; a busy
    # machine's scheduling delays are far shorter than half of it.
    lateness = stats["lateness"]
    assert lateness < stats["slowest_append"] / 2, f"a 10 ms ticker was delayed by {lateness:.3f}s: {stats}"


def test_idle_subscriptions_share_the_last_resort_reread_and_still_catch_a_lost_wakeup(db: pathlib.Path) -> None:
    """Without any wake-up, idle subscriptions re-read now and then; one read per topic serves them all.

    The watcher's change feed is silenced, so another backend object's append reaches its
    subscriptions only through the re-read a subscription does after ``reread_interval`` without
    news. Those reads are shared: a subscription at the position another one's recent read found
    to be the end skips its own.
    """
    subscriptions_count, interval = 12, 0.5
    with connect(_url(db)) as watcher, connect(_url(db)) as writer:
        topic = watcher.topic("t")
        topic.append(b"r0")
        subscriptions = [topic.subscribe_from_tail() for _ in range(subscriptions_count)]
        for subscription in subscriptions:
            subscription.__enter__()
        try:
            feed = hooks.sqlite_feed(watcher)
            assert feed is not None
            hooks.silence_sqlite_feed(feed)
            driver = hooks.sqlite_driver(watcher)
            driver.reread_interval = interval
            reads = [0]
            original = driver.read

            def counted(*args: object, **kwargs: object) -> object:
                reads[0] += 1
                return original(*args, **kwargs)  # type: ignore[arg-type]

            driver.read = counted  # type: ignore[method-assign]
            received: dict[int, list[bytes]] = {index: [] for index in range(subscriptions_count)}
            stop = threading.Event()

            def follow(index: int) -> None:
                while not stop.is_set():
                    record = subscriptions[index].receive(timeout=0.1)
                    if record is not None and record is not CLOSED:
                        received[index].append(record.payload)

            threads = [threading.Thread(target=follow, args=(index,)) for index in range(subscriptions_count)]
            for thread in threads:
                thread.start()
            try:
                idle = 10 * interval
                time.sleep(idle)  # the idle period itself is what is measured
                idle_reads = reads[0]
                # Alone, each subscription would re-read every interval: 12 x 10 = 120 reads.
                assert idle_reads <= 3 * idle / interval, f"{idle_reads} re-reads while idle"
                assert idle_reads >= 3, "nobody re-read: a lost wake-up would never be recovered"

                writer.topic("t").append(b"r1")  # its wake-up is lost: only a re-read finds it
                wait_until(
                    lambda: all(payloads == [b"r1"] for payloads in received.values()),
                    timeout=6 * interval + 2,
                    what="every subscription to find the record no wake-up announced",
                )
            finally:
                stop.set()
                for thread in threads:
                    thread.join(timeout=10)
        finally:
            for subscription in subscriptions:
                subscription.close()
