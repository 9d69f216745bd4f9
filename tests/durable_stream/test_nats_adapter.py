"""The NATS JetStream adapter beyond the shared contract, on a private current ``nats-server``.

Subjects of topic names, the server version check, stream settings, appends racing from several
connections (the compare-and-set that keeps ordinals dense), no JetStream consumers however many
subscriptions, a backend used across ``fork()``, and the gets a cursor built from an ordinal costs.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamUnavailableError,
    connect,
)
from api.core.durable_stream.testing.helpers import closing_all, drain, expect_cursor_unavailable
from harness.nats_server import NatsServer
from harness.redis_server import free_port
from harness.waiting import wait_until
from tests.durable_stream import hooks

SHARED_URL = ""  # every test here opens backends on its module's private server


@pytest.fixture(scope="module")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


@pytest.fixture
def stream() -> str:
    return f"T{uuid.uuid4().hex[:10]}"


@pytest.fixture
def open_nats(nats_server: NatsServer, stream: str) -> Iterator[Any]:
    def open_(**options: Any) -> DurableStreamBackend:
        return connect(nats_server.url, **{"stream": stream, "subject_prefix": stream.lower(), **options})

    with closing_all(open_) as opener:
        yield opener


def test_any_topic_name_maps_to_one_valid_subject_token(open_nats: Any) -> None:
    backend = open_nats()
    names = ["a", "a.b", "a b", "*", ">", "a.*.>", "ünïcødé", "x" * 512, "\U0001f600" * 100, "A", "a\tb", "$JS"]
    subjects = [hooks.nats_subject(backend, name) for name in names]
    assert len(set(subjects)) == len(names)
    for subject in subjects:
        token = subject.rpartition(".")[2]
        assert token and all(c in "abcdefghijklmnopqrstuvwxyz234567" for c in token)
    for index, name in enumerate(names):
        backend.topic(name).append(str(index).encode())
    for index, name in enumerate(names):
        with backend.topic(name).subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 1)] == [str(index).encode()]
            assert subscription.receive(timeout=0) is None


def test_an_older_server_is_refused(nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    hooks.nats_minimum_version(monkeypatch, (99, 0, 0))
    with pytest.raises(DurableStreamUnavailableError, match="too old"):
        connect(nats_server.url, stream="OLD")


def test_an_unreachable_server_fails_connect() -> None:
    with pytest.raises(DurableStreamUnavailableError):
        connect(f"nats://127.0.0.1:{free_port()}", connect_timeout=0.5)


def test_options_are_checked(nats_server: NatsServer) -> None:
    bad_options: list[dict[str, Any]] = [
        {"stream": "a.b"},
        {"subject_prefix": "a.*"},
        {"subject_prefix": "_DSLIVE.x"},  # the adapter's republish subjects
        {"storage": "tape"},
        {"replicas": 7},
        {"nope": 1},
    ]
    for bad in bad_options:
        with pytest.raises(ValueError):
            connect(nats_server.url, **bad)


def test_an_existing_stream_with_other_limits_is_refused(open_nats: Any) -> None:
    open_nats(max_records=10)
    with pytest.raises(ValueError, match="max_msgs_per_subject"):
        open_nats(max_records=20)
    open_nats(max_records=10).topic("t").append(b"same settings are fine")


def test_concurrent_appends_from_several_connections_never_duplicate_or_skip(open_nats: Any) -> None:
    """The compare-and-set race: writers on separate connections, many rounds, one topic each round."""
    backends = [open_nats() for _ in range(4)]
    rounds, writers_per_backend, per_writer = 10, 2, 25
    for round_ in range(rounds):
        name = f"race-{round_}"
        errors: list[BaseException] = []
        threads = _racing_writers(backends, writers_per_backend, name, per_writer, errors)
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not errors
        total = len(threads) * per_writer
        info = backends[0].admin.topic_info(name)
        assert info is not None and (info.length, info.first_ordinal, info.last_ordinal) == (total, 1, total)
        with backends[1].topic(name).subscribe_from_beginning() as subscription:
            payloads = [r.payload for r in drain(subscription, total)]
            assert subscription.receive(timeout=0) is None
        assert len(set(payloads)) == total, "a record was stored twice"
        for writer in range(len(threads)):
            own = [p for p in payloads if p.startswith(f"{writer}:".encode())]
            assert own == [f"{writer}:{index}".encode() for index in range(per_writer)]


def _racing_writers(
    backends: list[DurableStreamBackend], per_backend: int, name: str, count: int, errors: list[BaseException]
) -> list[threading.Thread]:
    start = threading.Barrier(len(backends) * per_backend)

    def write(backend: DurableStreamBackend, writer: int) -> None:
        try:
            start.wait()
            for index in range(count):
                backend.topic(name).append(f"{writer}:{index}".encode())
        except BaseException as exc:
            errors.append(exc)

    return [
        threading.Thread(target=write, args=(backend, number * per_backend + lane))
        for number, backend in enumerate(backends)
        for lane in range(per_backend)
    ]


def test_thousands_of_subscriptions_leave_no_jetstream_consumer(open_nats: Any) -> None:
    backend = open_nats()
    topics = [backend.topic(f"many-{index}") for index in range(200)]
    subscriptions = [topic.subscribe_from_tail() for topic in topics for _ in range(10)]
    for subscription in subscriptions:
        subscription.__enter__()
    try:
        for topic in topics[:20]:
            topic.append(b"x")
        for subscription in subscriptions[:200]:
            assert [r.payload for r in drain(subscription, 1)] == [b"x"]
        assert len(hooks.registered_topics(backend)) == 200
        assert hooks.nats_consumer_count(backend) == 0
    finally:
        for subscription in subscriptions:
            subscription.close()
    assert hooks.nats_consumer_count(backend) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_backend_created_before_fork_works_in_the_child(open_nats: Any) -> None:
    """A Celery prefork child: its own loop thread and connection, wake-ups from other processes included.

    Under gevent monkey-patching too: ``os.fork`` is gevent's there (the child's hub is re-initialised),
    and the child must not use the parent's loop thread, raw locks or hub callbacks either."""
    backend = open_nats()
    reread = hooks.driver(backend).reread_interval
    topic = backend.topic("forked")
    topic.append(b"parent")
    topic.append(b"parent 2")  # on the parent's publishing connection: open at the fork, never the child's
    with topic.subscribe_from_beginning() as subscription:  # the parent's change feed is running
        assert [r.payload for r in drain(subscription, 2)] == [b"parent", b"parent 2"]
        to_parent, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                topic.append(b"child")
                with topic.subscribe_from_beginning() as child_subscription:
                    got = [r.payload for r in drain(child_subscription, 3, timeout=10)]
                    os.write(from_child, b"r")  # waiting for the parent's next append now
                    started = time.monotonic()
                    live = [r.payload for r in drain(child_subscription, 1, timeout=reread)]
                    woken = time.monotonic() - started < reread / 2  # a wake-up, not the last-resort re-read
                code = 0 if got == [b"parent", b"parent 2", b"child"] and live == [b"from parent"] and woken else 2
                backend.close()
            finally:
                os.write(from_child, bytes([code]))
                os._exit(code)
        assert os.read(to_parent, 1) == b"r"
        time.sleep(0.2)
        topic.append(b"from parent")
        status = os.read(to_parent, 1)
        os.close(to_parent)
        os.close(from_child)
        os.waitpid(pid, 0)
        assert status == b"\x00"
        assert [r.payload for r in drain(subscription, 2)] == [b"child", b"from parent"]
    topic.append(b"parent again")
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 5)][-1] == b"parent again"
        assert subscription.receive(timeout=0) is None
    assert subscription.receive(timeout=0) is CLOSED


def test_records_read_before_another_backend_trimmed_them_are_not_served_again(open_nats: Any) -> None:
    """The read cache of one backend object never hides a trim or delete made through another."""
    reader, admin = open_nats(), open_nats()
    topic = reader.topic("cached")
    for index in range(10):
        topic.append(f"r{index}".encode())
    with topic.subscribe_from_beginning() as subscription:
        cursors = [r.cursor for r in drain(subscription, 10)]
    with topic.subscribe_from_cursor(cursors[0]) as again:  # served from the cache
        assert [r.payload for r in drain(again, 9)] == [f"r{index}".encode() for index in range(1, 10)]
    assert admin.admin.trim_topic("cached", keep_last=3) == 7
    expect_cursor_unavailable(topic, cursors[2])
    with topic.subscribe_from_cursor(cursors[6]) as retained:
        assert [r.payload for r in drain(retained, 3)] == [b"r7", b"r8", b"r9"]
    assert admin.admin.delete_topic("cached")
    admin.topic("cached").append(b"new")
    expect_cursor_unavailable(topic, cursors[6])
    with topic.subscribe_from_beginning() as fresh:
        assert [r.payload for r in drain(fresh, 1)] == [b"new"]


@pytest.mark.skipif(not hooks.gevent_active(), reason="gevent monkey-patching only")
def test_the_loop_thread_never_gets_a_gevent_hub(open_nats: Any) -> None:
    """Its connections use the original socket class: gevent's would make a hub in that thread."""
    import gc

    import gevent.hub

    backend = open_nats()
    topic = backend.topic("hubless")
    topic.append(b"one")
    topic.append(b"two")
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 2)] == [b"one", b"two"]
    hubs = [thing for thing in gc.get_objects() if isinstance(thing, gevent.hub.Hub)]
    assert hubs == [gevent.get_hub()], f"{len(hubs)} hubs: a thread other than the main one made one"


@pytest.mark.skipif(not hooks.gevent_active(), reason="gevent monkey-patching only")
def test_waiting_and_calling_never_block_the_gevent_hub(open_nats: Any) -> None:
    """NATS calls run on the loop thread: greenlets waiting in receive() or append() let others run."""
    import gevent

    backend = open_nats()
    topics = [backend.topic(f"hub-{index}") for index in range(10)]
    ticks: list[float] = []
    stop = False

    def tick() -> None:
        while not stop:
            gevent.sleep(0.005)
            ticks.append(time.monotonic())

    subscribed = []

    def read(index: int) -> list[bytes]:
        with topics[index].subscribe_from_tail() as subscription:
            subscribed.append(index)
            return [r.payload for r in drain(subscription, 20, timeout=30)]

    ticker = gevent.spawn(tick)
    readers = [gevent.spawn(read, index) for index in range(10) for _ in range(5)]
    # Every tail resolved before the first append (a reader subscribing after it would rightly miss it).
    wait_until(lambda: len(subscribed) == len(readers), timeout=30, what="every reader subscribed")
    started = time.monotonic()
    for number in range(20):
        for topic in topics:
            topic.append(str(number).encode())
    ended = time.monotonic()
    gevent.joinall(readers, timeout=60, raise_error=True)
    stop = True
    ticker.join()
    assert all(reader.value == [str(n).encode() for n in range(20)] for reader in readers)
    # Appends that blocked the hub would leave the ticker without a tick for all 200 of them.
    during = [t for t in ticks if started <= t <= ended]
    assert len(during) >= 0.3 * (ended - started) / 0.005 - 2, f"{len(during)} ticks in {ended - started:.3f} s"
    # No one call held the hub for most of the appends. Measured against the appends' own time, not a
    # fixed margin: on a machine whose CPUs are busy the whole process may wait half a second for one.
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert max(gaps, default=0.0) < max(0.5, (ended - started) / 2), (
        f"the hub was blocked for {max(gaps) * 1000:.0f} ms of {(ended - started) * 1000:.0f} ms of appends"
    )


def test_the_shared_old_server_is_refused() -> None:
    """The shared 127.0.0.1:4222 server (2.9) is refused at connect(), before any stream is touched."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 4222), timeout=0.5) as probe:
            info = probe.recv(4096)
    except OSError:
        pytest.skip("no server on 127.0.0.1:4222")
    version = json.loads(info.partition(b" ")[2]).get("version", "0.0.0")
    if tuple(int(part) for part in version.split("-")[0].split(".")[:2]) >= (2, 11):
        pytest.skip(f"the shared server is {version}, not older than the minimum")
    with pytest.raises(DurableStreamUnavailableError, match="too old"):
        connect("nats://127.0.0.1:4222", stream="NEVER_CREATED", subject_prefix="never.created")


def test_a_reader_past_the_old_incarnations_records_learns_of_the_new_one(open_nats: Any) -> None:
    """Found by the stateful model: a reader that had read records 1-3, after the topic was deleted and
    re-created with records 1-4, met the new 1-3 after its position and retried until it gave up with
    DurableStreamUnavailableError. A message stored after the reader's position with an ordinal it has
    passed proves a new incarnation: the reader gets CursorUnavailableError, as on every adapter."""
    backend = open_nats(buffer_size=3)
    name = f"recreated-{uuid.uuid4().hex}"
    topic = backend.topic(name)
    for index in range(3):
        topic.append(f"old-{index}".encode())
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 3)] == [b"old-0", b"old-1", b"old-2"]
        backend.admin.delete_topic(name)
        for index in range(4):
            topic.append(f"new-{index}".encode())
        with pytest.raises(CursorUnavailableError):
            subscription.receive(timeout=5)


def test_live_records_are_prefetched_and_a_trim_elsewhere_is_not_hidden(open_nats: Any) -> None:
    """Records pushed by the stream's republish wait for readers at the tail; another backend object's
    trim announces itself, so a reader behind it gets the gap, not the trimmed records."""
    reader, writer = open_nats(), open_nats()
    writer.topic("live").append(b"r0")
    with reader.topic("live").subscribe_from_tail() as subscription:
        for index in range(1, 10):
            writer.topic("live").append(f"r{index}".encode())
        wait_until(lambda: hooks.nats_prefetched(reader, "live") == 9, timeout=5, what="the republished records")
        assert writer.admin.trim_topic("live", keep_last=3) == 7
        wait_until(lambda: hooks.nats_prefetched(reader, "live") == 0, timeout=5, what="the trim notice")
        with pytest.raises(CursorUnavailableError):
            subscription.receive(timeout=2)
    with reader.topic("live").subscribe_from_tail() as subscription:
        writer.topic("live").append(b"r10")
        assert [r.payload for r in drain(subscription, 1)] == [b"r10"]


def test_prefetched_records_max_records_has_removed_are_not_served(open_nats: Any) -> None:
    backend = open_nats(max_records=5)
    topic = backend.topic("limited")
    topic.append(b"r0")
    with topic.subscribe_from_tail() as subscription:
        for index in range(1, 12):
            topic.append(f"r{index}".encode())
        assert hooks.nats_prefetched(backend, "limited") >= 11  # the appends' own, at once
        with pytest.raises(CursorUnavailableError):
            subscription.receive(timeout=2)


class _RequestTap:
    """A plain NATS connection that sees the requests sent to subjects (core NATS hands every
    subscriber a copy; this one never answers), so that a test can count a backend's gets."""

    def __init__(self, port: int, *subjects: str) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._buffer = b""
        self._line()  # INFO
        commands = [b"CONNECT {}"] + [f"SUB {subject} {sid}".encode() for sid, subject in enumerate(subjects, 1)]
        self._sock.sendall(b"\r\n".join(commands) + b"\r\n")
        self.requests()

    def close(self) -> None:
        self._sock.close()

    def _line(self) -> bytes:
        while b"\r\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            assert chunk, "the tap's connection closed"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\r\n")
        return line

    def _payload(self, size: int) -> bytes:
        while len(self._buffer) < size + 2:
            chunk = self._sock.recv(65536)
            assert chunk, "the tap's connection closed"
            self._buffer += chunk
        payload, self._buffer = self._buffer[:size], self._buffer[size + 2 :]
        return payload

    def requests(self) -> list[bytes]:
        """The payloads of the requests seen since the last call.

        The server writes a connection's messages in order, and every request seen here was handled
        before the backend's call returned: what precedes the answer to a PING is all of them.
        """
        self._sock.sendall(b"PING\r\n")
        seen: list[bytes] = []
        while (line := self._line()) != b"PONG":
            if line.startswith(b"MSG "):
                seen.append(self._payload(int(line.split()[-1])))
            elif line == b"PING":
                self._sock.sendall(b"PONG\r\n")
        return seen


def test_a_cursor_built_from_an_ordinal_is_found_in_a_few_gets(
    open_nats: Any, nats_server: NatsServer, stream: str
) -> None:
    """A cursor from ``admin.cursor_after`` carries no stream sequence, and a topic's records share the
    stream's sequences with every other topic. Found by the contract suite: a subscription from an
    ordinal more than one read past the topic's first record failed (the adapter looked for it only
    among the records of one read from the start). Now the place to read from is found with a few
    gets: none near the start, one in a topic alone on its stream, and in a topic whose records lie
    unevenly among others' not many more than halving the sequences down to half a read would take."""
    backend = open_nats()  # reads of 128 records: the search ends within 64 ordinals of the position
    count = 400
    for index in range(count):
        backend.topic("alone").append(f"r{index}".encode())
    for index in range(count):
        backend.topic("spread").append(f"r{index}".encode())
        # Dense at first, then among bursts of another topic's records.
        for _ in range(0 if index < 200 else 10):
            backend.topic("other").append(b"x")
    sequences = 2 * count + 10 * (count - 200)
    most = 2 * math.ceil(math.log2(sequences / 64))
    expected = [f"r{index}".encode() for index in range(count)]
    tap = _RequestTap(nats_server.port, f"$JS.API.DIRECT.GET.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}")
    try:
        for name in ("alone", "spread"):
            epoch = backend.admin.create_topic(name).epoch
            for ordinal in (0, 1, 64, 65, 127, 128, 199, 200, 201, 250, 333, count - 1, count):
                tap.requests()
                cursor = backend.admin.cursor_after(name, epoch, ordinal)
                with backend.topic(name).subscribe_from_cursor(cursor) as resumed:
                    assert [r.payload for r in drain(resumed, count - ordinal)] == expected[ordinal:]
                    assert resumed.receive(timeout=0) is None
                gets = [json.loads(request) for request in tap.requests()]
                # The search's gets: one message from a sequence (a batch's get asks for several, the
                # first retained message's starts at sequence 1).
                probes = [get["seq"] for get in gets if "batch" not in get and get.get("seq", 1) > 1]
                if ordinal <= 64 or ordinal == count:
                    assert probes == [], (name, ordinal)
                elif name == "alone":
                    assert len(probes) == 1, (name, ordinal, probes)
                else:
                    assert len(probes) <= most, (name, ordinal, probes)
    finally:
        tap.close()
