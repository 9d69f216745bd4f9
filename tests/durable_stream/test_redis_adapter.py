"""Redis adapter specifics: key layout, scripts, exact gap and epoch detection, shared readers.

Tests that only read and write use the shared server (127.0.0.1:6379) with a per-run key prefix and
per-test topic names; tests that restart a server, watch every command or count connections use a
private ``redis-server`` on a free port.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamError,
    DurableStreamSubscription,
    TopicSealedError,
    connect,
)
from api.core.durable_stream._cooperative import gevent_active, new_wake
from api.core.durable_stream._driver import Position
from harness.redis_server import RedisServer, free_port, redis_available
from tests.durable_stream import hooks

if TYPE_CHECKING:
    from api.core.durable_stream.adapters.redis.feed import RedisChangeFeed

from api.core.durable_stream.testing.helpers import (
    blocked_in_wait,
    drain,
    drain_until_closed,
    payloads,
    waiting_in_receive,
)
from harness.services import REDIS_PORT, redis_url
from harness.waiting import wait_until

SHARED_URL = redis_url(0)
KEY_PREFIX = f"dstest-{uuid.uuid4().hex[:12]}:"
#: The head check's period (``poll_interval``) of a reader whose test proves that a hint, a wake-up or
#: a close acted, not the check: long, so that "within half of it" holds however busy the machine is.
HEAD_CHECK = 20.0
#: How long a ``receive()`` or ``feed.wait()`` of these tests waits at most: what "at once" is measured against.
WAIT = 30.0

needs_redis_server = pytest.mark.skipif(not redis_available(), reason="redis-server is needed")


@pytest.fixture
def backend_defaults() -> dict[str, Any]:
    return {"key_prefix": KEY_PREFIX}


@pytest.fixture
def backend(open_backend: Callable[..., DurableStreamBackend]) -> DurableStreamBackend:
    return open_backend()


@pytest.fixture
def name() -> str:
    return f"adapter-{uuid.uuid4().hex}"


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(SHARED_URL, protocol=2)
    yield connection
    connection.close()


def keys_of(backend: DurableStreamBackend, topic: str) -> tuple[bytes, bytes, bytes]:
    return hooks.redis_keys(backend, topic)


def cursor_after(backend: DurableStreamBackend, name: str, count: int) -> list[Any]:
    with backend.topic(name).subscribe_from_beginning() as subscription:
        return [record.cursor for record in drain(subscription, count)]


def expect_unavailable_cursor(backend: DurableStreamBackend, name: str, cursor: Any) -> None:
    topic = backend.topic(name)
    try:
        subscription = topic.subscribe_from_cursor(cursor)
        subscription.__enter__()
    except CursorUnavailableError:
        return
    subscription.close()
    pytest.fail("a cursor past the retained records was accepted")


# -- storage layout -------------------------------------------------------------------------


def test_a_topic_is_one_stream_and_one_hash_in_one_slot(
    backend: DurableStreamBackend, client: redis.Redis, name: str
) -> None:
    topic = backend.topic(name)
    topic.append(b"first")
    topic.append(b"second")
    meta, stream, channel = keys_of(backend, name)
    assert meta == f"{{{KEY_PREFIX}{name}}}:m".encode()
    assert stream == f"{{{KEY_PREFIX}{name}}}:s".encode()
    assert channel == f"{{{KEY_PREFIX}{name}}}:n".encode()  # one hash tag: one cluster slot
    assert client.type(stream) == b"stream" and client.type(meta) == b"hash"
    entries = client.xrange(stream)
    assert [(fields[b"o"], fields[b"p"]) for _, fields in entries] == [(b"1", b"first"), (b"2", b"second")]
    state = client.hgetall(meta)
    assert state[b"l"] == b"2" and state[b"i"] == entries[-1][0] and len(state[b"e"]) == 16
    assert b"s" not in state
    topic.seal()
    assert client.hget(meta, "s") == b"1"


def test_topic_names_with_braces_get_a_private_hash_tag(backend: DurableStreamBackend, client: redis.Redis) -> None:
    names = [f"{{run}}-{uuid.uuid4().hex}", f"}}x{{-{uuid.uuid4().hex}", f"#{uuid.uuid4().hex}"]
    for index, name in enumerate(names):
        backend.topic(name).append(str(index).encode())
    for index, name in enumerate(names):
        meta, stream, _ = keys_of(backend, name)
        assert meta.count(b"{") == 1 and meta.count(b"}") == 1  # the tag is a digest, not the name
        assert meta[:-1] == stream[:-1]
        assert [fields[b"p"] for _, fields in client.xrange(stream)] == [str(index).encode()]
        with backend.topic(name).subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 1)] == [str(index).encode()]


def test_the_tail_survives_a_trim_to_empty(backend: DurableStreamBackend, client: redis.Redis, name: str) -> None:
    topic = backend.topic(name)
    for payload in payloads(3):
        topic.append(payload)
    backend.admin.trim_topic(name, keep_last=0)
    _, stream, _ = keys_of(backend, name)
    assert client.xlen(stream) == 0
    head = hooks.redis_driver(backend).head(name, create=False)
    assert head is not None and (head.first, head.last) == (4, 3)
    assert head.last_native == client.xinfo_stream(stream)["last-generated-id"].decode()
    with topic.subscribe_from_tail() as subscription:
        topic.append(b"after")
        assert [r.payload for r in drain(subscription, 1)] == [b"after"]


def test_read_locates_an_ordinal_without_a_stream_id(backend: DurableStreamBackend, client: redis.Redis) -> None:
    name = f"locate-{uuid.uuid4().hex}"
    topic = backend.topic(name)
    for index in range(60):
        topic.append(str(index).encode())
        if index % 7 == 0:
            time.sleep(0.002)  # spread the entries over several milliseconds, several per millisecond
    backend.admin.trim_topic(name, keep_last=50)  # first retained ordinal: 11
    driver = hooks.redis_driver(backend)
    for after in (10, 11, 12, 25, 33, 58, 59, 60):
        batch = driver.read(name, Position(after, ""), 5)
        assert [r.ordinal for r in batch.records] == list(range(after + 1, min(after + 6, 61)))
        assert [r.payload for r in batch.records] == [str(o - 1).encode() for o in range(after + 1, min(after + 6, 61))]
    # Before the first retained record: no records, and the head says why.
    batch = driver.read(name, Position(3, ""), 5)
    assert batch.records == [] and batch.head is not None and batch.head.first == 11


def test_a_malformed_stream_id_in_a_cursor_position_is_a_cursor_error(backend: DurableStreamBackend, name: str) -> None:
    backend.topic(name).append(b"x")
    with pytest.raises(CursorUnavailableError):
        hooks.redis_driver(backend).read(name, Position(1, "not-an-id"), 5)


def test_options_are_validated(open_backend: Callable[..., DurableStreamBackend]) -> None:
    with pytest.raises(ValueError, match="unknown option"):
        open_backend(no_such_option=1)
    with pytest.raises(ValueError, match="key_prefix"):
        open_backend(key_prefix="a{b}")
    with pytest.raises(ValueError, match="rediss"):
        open_backend(ssl_ca_certs="/nonexistent")
    with pytest.raises(ValueError):
        open_backend(max_records=0)
    backend = open_backend(f"{SHARED_URL}?max_records=3&read_connections=2&prefetch=false")
    assert hooks.redis_settings(backend).max_records == 3 and not hooks.redis_prefetching(backend)


def test_a_second_backend_with_the_same_prefix_resumes_cursors(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    first = open_backend()
    for payload in payloads(4):
        first.topic(name).append(payload)
    cursor = cursor_after(first, name, 2)[-1]
    other = open_backend(f"redis://localhost:{REDIS_PORT}/0")  # another spelling of the same server
    with other.topic(name).subscribe_from_cursor(cursor) as subscription:
        assert [r.payload for r in drain(subscription, 2)] == payloads(4)[2:]


# -- exact detection ------------------------------------------------------------------------


def test_append_time_trimming_past_a_cursor_is_detected_on_resume(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    backend = open_backend(max_records=5)
    topic = backend.topic(name)
    for payload in payloads(3):
        topic.append(payload)
    cursors = cursor_after(backend, name, 3)
    for payload in payloads(4, "later"):
        topic.append(payload)  # records 1 and 2 fall out of the 5 kept
    expect_unavailable_cursor(backend, name, cursors[0])
    with topic.subscribe_from_cursor(cursors[1]) as subscription:  # record 3 is the first retained one
        assert [r.payload for r in drain(subscription, 5)] == [b"r2", *payloads(4, "later")]
    info = backend.admin.topic_info(name)
    assert info is not None and (info.first_ordinal, info.last_ordinal, info.length) == (3, 7, 5)


def test_trimming_under_a_live_reader_by_another_producer_raises(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader = open_backend(buffer_size=1)
    producer = open_backend(max_records=3)
    topic = reader.topic(name)
    producer.topic(name).append(b"r0")
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 1)] == [b"r0"]
        for payload in payloads(10, "x"):
            producer.topic(name).append(payload)  # r0 and x0..x6 are trimmed away
        delivered: list[bytes] = []
        with pytest.raises(CursorUnavailableError):
            while True:
                result = subscription.receive(timeout=2)
                assert result is not None and result is not CLOSED
                delivered.append(result.payload)
                # What the reader read ahead before the trim (its buffer; under gevent also what it read
                # while the appends waited on the network) comes in order, and nothing from after the gap.
                assert delivered == payloads(7, "x")[: len(delivered)], "a record after the gap was delivered"
        assert subscription.receive(timeout=0) is CLOSED


def test_expired_topic_keys_are_detected(
    open_backend: Callable[..., DurableStreamBackend], client: redis.Redis, name: str
) -> None:
    backend = open_backend(max_age_seconds=0.5)
    topic = backend.topic(name)
    topic.append(b"old")
    meta, stream, _ = keys_of(backend, name)
    assert 0 < client.pttl(meta) <= 500 and 0 < client.pttl(stream) <= 500
    cursor = cursor_after(backend, name, 1)[0]
    live = topic.subscribe_from_cursor(cursor)
    live.__enter__()
    wait_until(lambda: client.exists(meta, stream) == 0, timeout=10, what="the keys to expire")
    expect_unavailable_cursor(backend, name, cursor)
    with pytest.raises(CursorUnavailableError):
        live.receive(timeout=5)  # the periodic head check finds the topic gone
    assert live.receive(timeout=0) is CLOSED


def test_keys_deleted_behind_the_adapters_back_are_detected(
    backend: DurableStreamBackend, client: redis.Redis, name: str
) -> None:
    topic = backend.topic(name)
    topic.append(b"a")
    cursor = cursor_after(backend, name, 1)[0]
    live = topic.subscribe_from_cursor(cursor)
    live.__enter__()
    client.delete(*keys_of(backend, name)[:2])
    topic.append(b"b")  # a new incarnation with a new epoch, ordinal 1 again
    expect_unavailable_cursor(backend, name, cursor)
    with pytest.raises(CursorUnavailableError):
        live.receive(timeout=5)


@needs_redis_server
def test_restart_without_persistence_invalidates_cursors(server: RedisServer) -> None:
    name = "restart-volatile"
    with connect(server.url) as backend:
        topic = backend.topic(name)
        for payload in payloads(3):
            topic.append(payload)
        cursor = cursor_after(backend, name, 2)[-1]
        live = topic.subscribe_from_cursor(cursor)
        live.__enter__()
        server.restart()
        topic.append(b"after restart")  # same name, new incarnation: ordinal 1 again
        expect_unavailable_cursor(backend, name, cursor)
        with pytest.raises(CursorUnavailableError):
            while live.receive(timeout=5) is not CLOSED:  # a buffered r2 may still come first
                pass
    with connect(server.url) as fresh:
        expect_unavailable_cursor(fresh, name, cursor)


@needs_redis_server
def test_restart_with_aof_resumes_with_nothing_lost() -> None:
    name = "restart-aof"
    with RedisServer(appendonly=True) as server, connect(server.url) as backend:
        topic = backend.topic(name)
        for payload in payloads(5):
            topic.append(payload)
        cursor = cursor_after(backend, name, 2)[-1]
        server.restart()  # SIGKILL; appendfsync always
        for payload in payloads(2, "new"):
            topic.append(payload)
        with topic.subscribe_from_cursor(cursor) as subscription:
            assert [r.payload for r in drain(subscription, 5)] == [*payloads(5)[2:], *payloads(2, "new")]
        with connect(server.url) as other, other.topic(name).subscribe_from_beginning() as everything:
            assert [r.payload for r in drain(everything, 7)] == [*payloads(5), *payloads(2, "new")]


# -- seal and wake-ups ----------------------------------------------------------------------


def test_a_seal_by_another_backend_wakes_a_reader_before_the_fallback_poll(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(), open_backend()
    with reader.topic(name).subscribe_from_tail() as subscription:
        wait_until(lambda: name in _subscribed_topics(reader), timeout=10.0, what="the shared reader to subscribe")
        writer.topic(name).append(b"last")
        assert [r.payload for r in drain(subscription, 1)] == [b"last"]
        started = time.monotonic()
        writer.topic(name).seal()
        assert subscription.receive(timeout=5) is CLOSED
        assert time.monotonic() - started < hooks.redis_driver(reader).reread_interval / 2
    with pytest.raises(TopicSealedError):
        reader.topic(name).append(b"late")


def test_records_from_another_backend_arrive_through_the_hint_without_extra_reads(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(), open_backend()
    reads = hooks.count_redis_reads(reader)
    subscriptions = [reader.topic(name).subscribe_from_tail() for _ in range(10)]
    for subscription in subscriptions:
        subscription.__enter__()
    writer.topic(name).append(b"warm-up")  # gives every subscription a stream ID to chain from
    for subscription in subscriptions:
        assert [r.payload for r in drain(subscription, 1)] == [b"warm-up"]
    wait_until(lambda: name in _subscribed_topics(reader), timeout=10.0, what="the shared reader to subscribe")
    before = reads()
    for index in range(20):
        writer.topic(name).append(str(index).encode())
        for subscription in subscriptions:
            assert [r.payload for r in drain(subscription, 1)] == [str(index).encode()]
    served_by_redis = reads() - before
    assert served_by_redis < 20, f"{served_by_redis} of 200 reads went to Redis"
    for subscription in subscriptions:
        subscription.close()


def test_without_prefetch_every_read_goes_to_redis_and_still_works(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(prefetch=False), open_backend(hint_payload_limit=0)
    with reader.topic(name).subscribe_from_tail() as subscription:
        for payload in payloads(50):
            writer.topic(name).append(payload)
        writer.topic(name).seal()
        assert [r.payload for r in drain_until_closed(subscription)] == payloads(50)


def test_large_payloads_skip_the_hint_but_are_delivered(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(), open_backend(hint_payload_limit=1024)
    big = bytes(range(256)) * 64
    with reader.topic(name).subscribe_from_tail() as subscription:
        writer.topic(name).append(big)
        writer.topic(name).append(b"small")
        assert [r.payload for r in drain(subscription, 2)] == [big, b"small"]


# -- commands sent ----------------------------------------------------------------------------


@needs_redis_server
def test_no_xdel_no_dollar_no_zero_id_and_scripts_by_sha(server: RedisServer) -> None:
    monitor = _Monitor(server.port)
    try:
        with connect(server.url, max_records=5, max_age_seconds=60) as backend:
            topic = backend.topic("watched")
            with topic.subscribe_from_tail() as tail:
                for payload in payloads(8):
                    topic.append(payload)
                    assert [r.payload for r in drain(tail, 1)] == [payload]
            with topic.subscribe_from_beginning() as beginning:
                assert [r.payload for r in drain(beginning, 5)] == payloads(8)[3:]
            backend.admin.trim_topic("watched", keep_last=2)
            backend.admin.enforce_retention()
            topic.seal()
            backend.admin.topic_info("watched")
            backend.admin.delete_topic("watched")
    finally:
        commands = monitor.stop()
    assert commands, "MONITOR saw nothing"
    words = [command.split() for command in commands]
    assert not [w for w in words if w and w[0].strip('"').upper() == "XDEL"]
    assert not [w for w in words if '"$"' in w or '"0-0"' in w], "a '$' or '0-0' reached the server"
    assert not [w for w in words if w and w[0].strip('"').upper() == "EVAL"], "script text sent instead of EVALSHA"
    assert any('"XTRIM"' in w or '"MAXLEN"' in w for w in words)


# -- shared readers ---------------------------------------------------------------------------


@needs_redis_server
def test_2000_subscriptions_on_200_topics_read_over_at_most_4_connections(server: RedisServer) -> None:
    topics, per_topic, records = 200, 10, 12
    with connect(server.url, read_connections=3) as backend, connect(server.url) as producer:
        subscriptions: list[tuple[str, DurableStreamSubscription]] = []
        for index in range(topics):
            name = f"fan-{index}"
            for _ in range(per_topic):
                subscription = backend.topic(name).subscribe_from_tail()
                subscription.__enter__()
                subscriptions.append((name, subscription))
        received: dict[int, list[bytes]] = {i: [] for i in range(len(subscriptions))}
        errors: list[BaseException] = []
        done = threading.Event()

        def consume(indices: range) -> None:
            try:
                while not done.is_set():
                    idle = True
                    for i in indices:
                        result = subscriptions[i][1].receive(timeout=0)
                        if result is not None and result is not CLOSED:
                            received[i].append(result.payload)
                            idle = False
                    if all(len(received[i]) >= records for i in indices):
                        return
                    if idle:
                        time.sleep(0.005)  # pacing: this thread polls 100 subscriptions with receive(timeout=0)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=consume, args=(range(i, i + 100),)) for i in range(0, 2000, 100)]
        for worker in workers:
            worker.start()
        for number in range(records):
            for index in range(topics):
                producer.topic(f"fan-{index}").append(f"fan-{index}:{number}".encode())
        peak_readers = _reading_connections(server)
        for worker in workers:
            worker.join(timeout=120)
        done.set()
        peak_readers = max(peak_readers, _reading_connections(server))
        assert not errors
        for i, (name, _) in enumerate(subscriptions):
            assert received[i] == [f"{name}:{n}".encode() for n in range(records)]
        assert peak_readers <= 4, f"{peak_readers} connections read for 2,000 subscriptions"
        assert hooks.redis_feed(backend).link_count() == 1
        # Closing some subscriptions wakes nobody else and leaves the rest working.
        for _, subscription in subscriptions[::2]:
            subscription.close()
        producer.topic("fan-0").append(b"fan-0:after")
        for i, (_, subscription) in enumerate(subscriptions[:per_topic]):
            if i % 2:
                assert [r.payload for r in drain(subscription, 1)] == [b"fan-0:after"]
            else:
                assert subscription.receive(timeout=0) is CLOSED


# -- a waiting subscription reads the hints itself (plain threads) ------------------------------

threads_only = pytest.mark.skipif(
    gevent_active(), reason="subscriptions read the hints themselves only in plain threads"
)


def _receiving(subscription: DurableStreamSubscription, into: list[Any], timeout: float = 10) -> threading.Thread:
    """A thread that receives one result into ``into``."""
    thread = threading.Thread(target=lambda: into.append(subscription.receive(timeout=timeout)), daemon=True)
    thread.start()
    return thread


def _feed(backend: DurableStreamBackend) -> RedisChangeFeed:
    return hooks.redis_feed(backend)


def _reads_the_links(feed: RedisChangeFeed, thread: threading.Thread) -> bool:
    return hooks.links_reader(feed) == thread.ident and blocked_in_wait(thread)


def _subscribed_feed(backend: DurableStreamBackend, *topics: str, listening: bool = False) -> RedisChangeFeed:
    """The backend's feed, once the topics' hints arrive (and, with ``listening``, its listener reads)."""
    feed = _feed(backend)
    wait_until(lambda: set(topics) <= _subscribed_topics(backend), timeout=10.0, what="the shared reader to subscribe")
    if listening:
        wait_until(lambda: hooks.listener_reads(feed), timeout=10.0, what="the listener to read")
    return feed


def _receive_reading_the_hints(
    backend: DurableStreamBackend, subscription: DurableStreamSubscription, *topics: str
) -> tuple[RedisChangeFeed, threading.Thread, list[Any]]:
    """Once the topics' hints arrive, start a ``receive()`` and wait until it reads them itself."""
    feed = _subscribed_feed(backend, *topics)
    received: list[Any] = []
    thread = _receiving(subscription, received, timeout=WAIT)

    def reading() -> bool:
        # A receive() that returned (it must wait WAIT seconds for a record nobody appends) says what it got.
        assert thread.is_alive(), f"receive() returned {received!r} before reading the hints"
        return _reads_the_links(feed, thread)

    wait_until(reading, timeout=10.0, what="receive() to read the hints itself")
    return feed, thread, received


def _append_and_expect(
    writer: DurableStreamBackend, topic: str, payload: bytes, thread: threading.Thread, received: list[Any]
) -> None:
    """Append ``payload``; the receiving ``thread`` must return exactly it, by its hint: within half the
    reader's head check (``HEAD_CHECK``), which would otherwise have been the first to find it."""
    started = time.monotonic()
    writer.topic(topic).append(payload)
    thread.join(timeout=HEAD_CHECK / 2)
    assert [r.payload for r in received] == [payload]
    assert time.monotonic() - started < HEAD_CHECK / 2


@threads_only
def test_a_lone_waiting_subscription_takes_the_hints_from_the_listener_and_gives_them_back(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(poll_interval=HEAD_CHECK), open_backend()
    with reader.topic(name).subscribe_from_tail() as subscription:
        for number in range(3):
            feed, thread, received = _receive_reading_the_hints(reader, subscription, name)
            _append_and_expect(writer, name, f"hinted-{number}".encode(), thread, received)
            assert hooks.links_reader(feed) != thread.ident
    # Closing the subscription unwatches its topic, which calls the listener back at once.
    wait_until(lambda: hooks.listener_reads(feed), timeout=0.5, what="the listener to read again")


@threads_only
def test_a_wake_up_from_another_thread_interrupts_a_subscription_reading_the_hints(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    backend = open_backend(poll_interval=HEAD_CHECK)
    with backend.topic(name).subscribe_from_tail() as subscription:
        feed = _subscribed_feed(backend, name)
        wake = new_wake()
        returned = threading.Event()
        thread = threading.Thread(target=lambda: (feed.wait(wake, WAIT), returned.set()), daemon=True)
        thread.start()
        wait_until(lambda: _reads_the_links(feed, thread), timeout=10.0, what="the waiter to read the hints itself")
        started = time.monotonic()
        wake.set()  # no hint: nothing arrives on the link, only the wake-up
        assert returned.wait(WAIT / 2)
        assert time.monotonic() - started < WAIT / 2
        # close() from another thread ends a receive() that is reading the hints, at once.
        _, receiving, received = _receive_reading_the_hints(backend, subscription, name)
        started = time.monotonic()
        subscription.close()
        receiving.join(timeout=WAIT / 2)
        assert received == [CLOSED]
        assert time.monotonic() - started < WAIT / 2


@threads_only
def test_when_the_reading_subscription_leaves_the_listener_serves_the_others_at_once(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(poll_interval=HEAD_CHECK), open_backend()
    first, second = f"{name}-first", f"{name}-second"
    with reader.topic(first).subscribe_from_tail() as one, reader.topic(second).subscribe_from_tail() as other:
        feed, leader, got_one = _receive_reading_the_hints(reader, one, first, second)
        got_other: list[Any] = []
        follower = _receiving(other, got_other)
        wait_until(lambda: blocked_in_wait(follower), timeout=10.0, what="the second waiter to block")
        assert hooks.links_reader(feed) == leader.ident  # a second waiter does not take the links
        _append_and_expect(writer, first, b"for the reader", leader, got_one)
        # The follower still waits: the listener must read for it now, not at its next tick.
        wait_until(lambda: hooks.listener_reads(feed), timeout=0.5, what="the listener to take over")
        _append_and_expect(writer, second, b"for the follower", follower, got_other)


@threads_only
@pytest.mark.parametrize("dawdling_in", ["_check_health", "_listen"], ids=["busy-listener", "slow-hand-over"])
def test_a_lone_waiter_whose_hand_over_request_times_out_is_still_served_at_once(
    open_backend: Callable[..., DurableStreamBackend], name: str, monkeypatch: pytest.MonkeyPatch, dawdling_in: str
) -> None:
    # The listener is slower than a hand-over may wait: busy in a pass (connecting, refreshing)
    # when the request comes, or slow to let go of the baton after it stopped reading for it. The
    # waiter withdraws its request; the listener must go on reading for it, not give the links
    # up to nobody until its next tick.
    armed, dawdled = threading.Event(), threading.Event()
    feed_class = hooks.redis_change_feed_class()
    original = getattr(feed_class, dawdling_in)

    def dawdling(feed: RedisChangeFeed) -> None:
        original(feed)
        if armed.is_set():
            armed.clear()
            time.sleep(0.05)  # the slowness being simulated, well over the 10 ms a hand-over waits
            dawdled.set()

    monkeypatch.setattr(feed_class, dawdling_in, dawdling)
    reader, writer = open_backend(poll_interval=HEAD_CHECK), open_backend()
    with reader.topic(name).subscribe_from_tail() as subscription:
        _subscribed_feed(reader, name, listening=True)
        armed.set()
        received: list[Any] = []
        thread = _receiving(subscription, received, timeout=WAIT)
        assert dawdled.wait(5)
        wait_until(lambda: blocked_in_wait(thread), timeout=10.0, what="receive() to wait")
        _append_and_expect(writer, name, b"served by the listener", thread, received)


@threads_only
def test_the_listener_sleeps_while_a_subscription_reads_even_when_called_meanwhile(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    stat = pathlib.Path("/proc/self/task")
    if not stat.is_dir():
        pytest.skip("needs Linux's per-thread CPU times")
    reader, writer = open_backend(poll_interval=HEAD_CHECK), open_backend()
    with reader.topic(name).subscribe_from_tail() as subscription:
        feed, thread, received = _receive_reading_the_hints(reader, subscription, name)
        ticks = os.sysconf("SC_CLK_TCK")

        def listener_cpu() -> float:
            fields = (stat / str(hooks.listener_thread(feed).native_id) / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime

        before = listener_cpu()
        hooks.leave_listener_call(feed)  # a call for the listener left over while the subscription keeps reading
        time.sleep(0.5)  # the span over which CPU time is measured, not a wait for a condition
        assert listener_cpu() - before < 0.1
        assert hooks.links_reader(feed) == thread.ident
        _append_and_expect(writer, name, b"still read by the subscription", thread, received)


@threads_only
def test_a_link_disconnected_under_a_reading_subscription_is_replaced_with_its_subscriptions(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(poll_interval=HEAD_CHECK), open_backend()
    with reader.topic(name).subscribe_from_tail() as subscription:
        feed, thread, received = _receive_reading_the_hints(reader, subscription, name)
        (link,) = hooks.feed_links(feed).values()
        # What redis-py does to a connection whose read is interrupted (KeyboardInterrupt in the
        # reading thread): it disconnects, and would reconnect on its next use without the
        # subscription. The feed must treat that as a broken link.
        link.connection.disconnect()
        hooks.wake_listener(feed)
        wait_until(
            lambda: hooks.feed_links(feed).get(link.address) not in (None, link) and name in _subscribed_topics(reader),
            timeout=5,
            what="a new link with the topic's subscription",
        )
        _append_and_expect(writer, name, b"after the new link", thread, received)


@threads_only
def test_a_topic_watched_while_a_subscription_reads_the_hints_is_subscribed_by_the_listener(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(poll_interval=HEAD_CHECK), open_backend()
    early, late = f"{name}-early", f"{name}-late"
    with reader.topic(early).subscribe_from_tail() as waiting:
        _, thread, got = _receive_reading_the_hints(reader, waiting, early)
        with reader.topic(late).subscribe_from_tail() as newcomer:
            wait_until(lambda: late in _subscribed_topics(reader), timeout=2, what="the new topic's hints")
            writer.topic(late).append(b"late")
            assert [r.payload for r in drain(newcomer, 1)] == [b"late"]
        _append_and_expect(writer, early, b"early", thread, got)


@pytest.mark.parametrize("waiting", [False, True], ids=["listener-reads", "subscription-waits"])
def test_closing_the_backend_stops_its_shared_reader_at_once(name: str, waiting: bool) -> None:
    backend = connect(SHARED_URL, key_prefix=KEY_PREFIX, poll_interval=HEAD_CHECK)
    with backend.topic(name).subscribe_from_tail() as subscription:
        feed = _subscribed_feed(backend, name, listening=not waiting)
        received: list[Any] = []
        if waiting:
            thread = _receiving(subscription, received, timeout=WAIT)
            wait_until(lambda: waiting_in_receive(subscription, thread), timeout=10.0, what="receive() to block")
        started = time.monotonic()
        backend.close()
        # Not at the listener's next tick (the head check) nor at the receive's timeout.
        assert time.monotonic() - started < HEAD_CHECK / 2
        assert not hooks.listener_thread(feed).is_alive()
        if waiting:
            thread.join(timeout=WAIT / 2)
            assert received == [CLOSED]


@pytest.mark.skipif(not gevent_active(), reason="gevent monkey-patching only")
def test_under_gevent_the_listener_alone_reads_the_hints(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(), open_backend()
    with reader.topic(name).subscribe_from_tail() as subscription:
        feed = _subscribed_feed(reader, name)
        readers: set[int] = set()

        def recorded(deliver: Callable[[str, bytes], None], topic: str, message: bytes) -> None:
            readers.add(threading.get_ident())
            deliver(topic, message)

        hooks.intercept_redis_hints(feed, recorded)
        received: list[Any] = []
        thread = _receiving(subscription, received)
        wait_until(lambda: waiting_in_receive(subscription, thread), timeout=10.0, what="receive() to block")
        writer.topic(name).append(b"via the listener")
        thread.join(timeout=5)
        assert [r.payload for r in received] == [b"via the listener"]
        assert readers == {hooks.listener_thread(feed).ident}


# -- helpers ----------------------------------------------------------------------------------


def _subscribed_topics(backend: DurableStreamBackend) -> set[str]:
    return {topic for feed in hooks.redis_feeds(backend) for topic in feed.subscribed_topics()}


def _reading_connections(server: RedisServer) -> int:
    listing = server.cli("client", "list")
    return sum(1 for line in listing.splitlines() if ":read" in line or ":feed" in line)


class _Monitor:
    """Every command the server runs (including those inside scripts), via MONITOR."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.sendall(b"MONITOR\r\n")
        self._buffer = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_until(lambda: b"+OK" in self._buffer, timeout=10.0, what="MONITOR to start")

    def _run(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                chunk = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            self._buffer += chunk

    def stop(self) -> list[str]:
        # Commands already run may still be on their way here: a marker sent after them arrives after them.
        marker = f"monitor-end-{uuid.uuid4().hex}".encode()
        with socket.create_connection(("127.0.0.1", self._port)) as other:
            other.sendall(b"ECHO " + marker + b"\r\n")
            other.recv(1024)
        wait_until(lambda: marker in self._buffer, timeout=10.0, what="MONITOR to show every command")
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        lines = self._buffer.decode(errors="replace").split("\r\n")
        return [line.split("] ", 1)[1] for line in lines if "] " in line]


def test_no_backend_error_type_escapes_on_a_closed_backend(open_backend: Callable[..., DurableStreamBackend]) -> None:
    backend = open_backend()
    backend.close()
    with pytest.raises(DurableStreamError) as raised:
        backend.topic("x").append(b"y")
    assert not type(raised.value).__module__.startswith("redis")


def test_idle_subscriptions_cost_no_reads_and_one_head_check_covers_all_topics(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    backend = open_backend(poll_interval=0.05)
    reads = hooks.count_redis_reads(backend)
    checks = hooks.count_redis_head_checks(backend)
    names = [f"{name}-{index}" for index in range(5)]
    subscriptions = []
    for topic_name in names:
        backend.topic(topic_name).append(b"r0")
        for _ in range(2):
            subscription = backend.topic(topic_name).subscribe_from_beginning()
            subscription.__enter__()
            assert [r.payload for r in drain(subscription, 1)] == [b"r0"]
            subscriptions.append(subscription)
    wait_until(lambda: set(names) <= _subscribed_topics(backend), timeout=10.0, what="the shared reader to subscribe")
    # Caught up: once subscribed, the shared reader wakes each topic once (closing the window between a
    # subscription's first read and the subscribe), and a subscription reads on its next receive. When
    # that wake-up came after a topic's subscriptions had drained, they read once more: a round of
    # receives that reads nothing shows every wake-up taken (two in a row: a topic is counted as
    # subscribed just before its wake-up is sent).
    quiet = 0

    def settled() -> bool:
        nonlocal quiet
        before = reads()
        assert all(subscription.receive(timeout=0) is None for subscription in subscriptions)
        quiet = quiet + 1 if reads() == before else 0
        return quiet >= 2

    wait_until(settled, timeout=10.0, what="the subscriptions to catch up and wait")
    before_reads, before_checks = reads(), len(checks)
    started = time.monotonic()
    for subscription in subscriptions:
        assert subscription.receive(timeout=0.1) is None
    elapsed = time.monotonic() - started
    assert reads() == before_reads, "idle subscriptions read from Redis"
    made = checks[before_checks:]
    assert made, "no periodic head check while idle"
    assert len(made) <= elapsed / 0.05 + 2  # one check per interval, however many subscriptions wait
    assert all(sorted(topics) == sorted(names) for topics in made)
    with connect(SHARED_URL, key_prefix=KEY_PREFIX) as other:
        other.topic(names[0]).append(b"r1")
        other.topic(names[0]).seal()
    for subscription in subscriptions[:2]:
        assert [r.payload for r in drain_until_closed(subscription)] == [b"r1"]
    for subscription in subscriptions:
        subscription.close()


def test_a_lost_hint_is_recovered_by_the_periodic_head_check(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(poll_interval=0.2), open_backend()
    with reader.topic(name).subscribe_from_tail() as subscription:
        wait_until(lambda: name in _subscribed_topics(reader), timeout=10.0, what="the shared reader to subscribe")
        feed = hooks.redis_feed(reader)
        dropped: list[bytes] = []

        def lose_one(deliver: Callable[[str, bytes], None], topic: str, message: bytes) -> None:
            if topic == name and not dropped:
                dropped.append(message)  # as if the link had lost it
                return
            deliver(topic, message)

        hooks.intercept_redis_hints(feed, lose_one)
        started = time.monotonic()
        writer.topic(name).append(b"unannounced")
        reread = hooks.redis_driver(reader).reread_interval
        assert [r.payload for r in drain(subscription, 1, timeout=reread / 2)] == [b"unannounced"]
        # Without the check it would wait for the subscription's own last-resort re-read.
        assert time.monotonic() - started < reread / 2
        # The hint did arrive (and was dropped), possibly after the check had already delivered.
        wait_until(lambda: bool(dropped), timeout=10.0, what="the hint to be intercepted")


def test_a_seal_right_after_an_append_closes_readers_fed_from_the_prefetch(
    open_backend: Callable[..., DurableStreamBackend], name: str
) -> None:
    reader, writer = open_backend(poll_interval=HEAD_CHECK), open_backend()
    for round_ in range(20):
        topic_name = f"{name}-{round_}"
        with reader.topic(topic_name).subscribe_from_tail() as subscription:
            wait_until(
                lambda topic_name=topic_name: topic_name in _subscribed_topics(reader),
                timeout=10.0,
                what="the shared reader to subscribe",
            )
            writer.topic(topic_name).append(b"last")
            writer.topic(topic_name).seal()
            started = time.monotonic()
            assert [r.payload for r in drain_until_closed(subscription, timeout=HEAD_CHECK / 2)] == [b"last"]
            # The seal's hint must reach a reader that took the record from the prefetch (not the head check).
            assert time.monotonic() - started < HEAD_CHECK / 2


def test_keys_deleted_by_hand_are_detected_by_a_waiting_reader_without_any_hint(
    open_backend: Callable[..., DurableStreamBackend], client: redis.Redis, name: str
) -> None:
    # Nothing but the periodic head check (every poll_interval) can notice this.
    backend = open_backend(poll_interval=0.1)
    topic = backend.topic(name)
    topic.append(b"r0")
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 1)] == [b"r0"]
        wait_until(lambda: name in _subscribed_topics(backend), timeout=10.0, what="the shared reader to subscribe")
        assert subscription.receive(timeout=0.3) is None
        client.delete(*keys_of(backend, name)[:2])  # no script, so no hint
        started = time.monotonic()
        reread = hooks.redis_driver(backend).reread_interval
        with pytest.raises(CursorUnavailableError):
            subscription.receive(timeout=reread / 2)
        # The head check (every 0.1 s) noticed, not the subscription's last-resort re-read.
        assert time.monotonic() - started < reread / 2


@needs_redis_server
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")
def test_rediss_url_reaches_a_tls_server(tmp_path: pathlib.Path) -> None:
    ca, cert, key = _tls_files(tmp_path)
    tls_port = free_port()
    tls = [
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
    ]  # fmt: skip
    with RedisServer(extra=tls) as server:
        url = f"rediss://127.0.0.1:{tls_port}/0"
        with connect(url, ssl_ca_certs=str(ca)) as backend, connect(url, ssl_ca_certs=str(ca)) as producer:
            topic = backend.topic("tls")
            with topic.subscribe_from_tail() as subscription:
                wait_until(
                    lambda: "tls" in _subscribed_topics(backend), timeout=10.0, what="the shared reader over TLS"
                )
                producer.topic("tls").append(b"over tls")
                assert [r.payload for r in drain(subscription, 1)] == [b"over tls"]
        assert "tls" not in server.cli("client", "list")  # plain port untouched by the adapter
        with pytest.raises(DurableStreamError):
            connect(url, socket_connect_timeout=1)  # no CA: the certificate is refused


def _tls_files(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, request = directory / "server.crt", directory / "server.key", directory / "server.csr"
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
            "-days", "1", "-subj", "/CN=durable-stream-test-ca")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    openssl("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "1", "-extfile", str(extensions))  # fmt: skip
    return ca, cert, key
