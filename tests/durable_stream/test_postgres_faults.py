"""PostgreSQL adapter under faults, against a private server this module starts (never the shared one).

Documented behaviour (see ``docs/adapters/postgres.md``):

- A connection terminated by the server (``pg_terminate_backend``, idle-session timeouts, a proxy)
  is replaced transparently: idle pooled connections are discarded at checkout, reads are retried
  once, the hint connection reconnects and wakes every watched topic. A subscription continues from
  its exact position; the core's ordinal check on every batch proves nothing was skipped.
- An append whose own connection dies mid-call raises ``DurableStreamUnavailableError`` (the record
  may or may not be stored); it is never retried behind the caller's back.
- When the server is unreachable, ``connect``/``append``/``receive`` raise
  ``DurableStreamUnavailableError``; a waiting subscription then returns ``CLOSED`` for good.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from api.core.durable_stream import (
    CLOSED,
    DurableStreamError,
    DurableStreamRecord,
    DurableStreamUnavailableError,
    connect,
)
from api.core.durable_stream.testing.helpers import blocked_in_wait
from harness.postgres_server import PostgresServer, postgres_available
from harness.waiting import wait_until
from tests.durable_stream import hooks

pytestmark = pytest.mark.skipif(not postgres_available(), reason="PostgreSQL server binaries are not installed")


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    with PostgresServer() as private:
        yield private


@pytest.fixture
def running(server: PostgresServer) -> Iterator[PostgresServer]:
    """The module's server, guaranteed up before and after the test (tests may stop or kill it)."""
    if not server.is_running():
        server.start()
    yield server
    if not server.is_running():
        server.start()


def _backend_pids(server: PostgresServer, application_name: str) -> set[int]:
    out = server.psql(f"SELECT pid FROM pg_stat_activity WHERE application_name = '{application_name}'")
    return {int(line) for line in out.split()}


def _terminate(server: PostgresServer, application_name: str) -> int:
    out = server.psql(
        f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{application_name}'"
    )
    return int(out.strip())


def test_connect_to_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connect_timeout = 2
    started = time.monotonic()
    with pytest.raises(DurableStreamUnavailableError) as caught:
        connect(f"postgresql://postgres@127.0.0.1:{port}/test", connect_timeout=connect_timeout)
    # Refused, or at worst a few connect timeouts: never a wait without end.
    assert time.monotonic() - started < 10 * connect_timeout
    assert type(caught.value) is DurableStreamUnavailableError


def test_terminated_connections_are_replaced_without_skipping(running: PostgresServer) -> None:
    app = f"ds-term-{uuid.uuid4().hex[:8]}"
    name = f"t-{uuid.uuid4().hex}"
    # The reader's fallback poll is pushed far out: after the reconnect, only NOTIFY can be quick.
    poll_interval = 30.0
    with (
        connect(running.url, application_name=app, poll_interval=poll_interval) as reader,
        connect(running.url) as writer,
    ):
        topic = writer.topic(name)
        for index in range(5):
            topic.append(f"r{index}".encode())
        subscription = reader.topic(name).subscribe_from_beginning()
        subscription.__enter__()
        received: list[DurableStreamRecord] = []
        errors: list[BaseException] = []
        done = threading.Event()

        def consume() -> None:
            try:
                while len(received) < 15:
                    result = subscription.receive(timeout=0.5)
                    if result is CLOSED:
                        raise AssertionError("closed")
                    if result is not None:
                        received.append(result)
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        wait_until(lambda: len(received) == 5, timeout=10, what="the first records")
        wait_until(lambda: len(_backend_pids(running, app)) >= 2, timeout=10, what="the hint connection")
        before = _backend_pids(running, app)
        assert _terminate(running, app) >= 2  # the hint connection and the idle pooled one(s)
        for index in range(5, 10):
            topic.append(f"r{index}".encode())
        wait_until(
            lambda: len(received) == 10 or bool(errors), timeout=10, what="records appended after the termination"
        )

        def listening_again() -> bool:
            # A new hint connection that has LISTEN-ed (until then only the 30 s poll would wake the reader).
            pid, channels = hooks.postgres_listening(reader)
            return pid is not None and pid not in before and bool(channels)

        wait_until(listening_again, timeout=10, what="the hint connection to come back and LISTEN")
        latencies = []
        for index in range(10, 15):
            started = time.monotonic()
            topic.append(f"r{index}".encode())
            wait_until(
                lambda i=index: len(received) > i or bool(errors),
                timeout=poll_interval / 2,
                what="a record after the reconnect",
            )
            latencies.append(time.monotonic() - started)
        done.wait(10)
        consumer.join(10)
        assert not errors, errors
        codec = hooks.cursor_codec(reader, name)
        assert [r.payload for r in received] == [f"r{i}".encode() for i in range(15)]
        assert [codec.decode(r.cursor).position.ordinal for r in received] == list(range(1, 16))
        assert max(latencies) < poll_interval / 2, latencies  # woken by NOTIFY again, not by the 30 s poll
        info = reader.admin.topic_info(name)  # pooled connections were replaced as well
        assert info is not None and info.last_ordinal == 15
        subscription.close()


def test_idle_pooled_connections_closed_by_the_server_are_never_handed_to_an_append(
    running: PostgresServer,
) -> None:
    app = f"ds-idle-{uuid.uuid4().hex[:8]}"
    with connect(running.url, application_name=app, pool_size=4, notify=False) as backend:
        topics = [backend.topic(f"t-{uuid.uuid4().hex}") for _ in range(4)]
        for topic in topics:
            topic.append(b"warm")
        # Four pooled connections, all idle afterwards: held at once, so that none is reused (four
        # appends racing after a barrier sometimes shared one).
        held = [hooks.postgres_engine(backend).raw_connection() for _ in range(4)]
        for pooled in held:
            pooled.close()
        assert len(_backend_pids(running, app)) == 4
        _terminate(running, app)
        wait_until(lambda: not _backend_pids(running, app), timeout=10, what="the terminated backends to exit")
        # Appends are never retried (the record might be stored twice), so each of these succeeding
        # shows that the dead idle connections were discarded at checkout, not used.
        for round_ in range(3):
            for topic in topics:
                topic.append(f"after-{round_}".encode())
        for topic in topics:
            info = backend.admin.topic_info(topic.name)  # type: ignore[attr-defined]
            assert info is not None and info.last_ordinal == 4


def test_appends_while_connections_are_terminated_fail_cleanly(running: PostgresServer) -> None:
    app = f"ds-kill-{uuid.uuid4().hex[:8]}"
    name = f"t-{uuid.uuid4().hex}"
    with connect(running.url, application_name=app, pool_size=4) as backend:
        topic = backend.topic(name)
        succeeded: list[bytes] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def append_forever(worker: int) -> None:
            index = 0
            while not stop.is_set():
                payload = f"{worker}:{index}".encode()
                index += 1
                try:
                    topic.append(payload)
                except DurableStreamError as exc:
                    failures.append(exc)
                except BaseException as exc:  # anything else escaping is the bug under test
                    failures.append(exc)
                    raise
                else:
                    succeeded.append(payload)

        workers = [threading.Thread(target=append_forever, args=(i,)) for i in range(4)]
        for worker in workers:
            worker.start()
        for _ in range(5):
            time.sleep(0.15)
            _terminate(running, app)
        time.sleep(0.15)
        stop.set()
        for worker in workers:
            worker.join(10)
        assert succeeded, "no append succeeded"
        assert all(type(exc) is DurableStreamUnavailableError for exc in failures), failures
        assert len(succeeded) > len(failures)
        # Dense ordinals, and every acknowledged record is there (an unacknowledged one may be too).
        with backend.topic(name).subscribe_from_beginning() as subscription:
            stored: list[bytes] = []
            while len(stored) < len(succeeded):
                result = subscription.receive(timeout=2.0)
                assert result is not None and result is not CLOSED
                stored.append(result.payload)
        info = backend.admin.topic_info(name)
        assert info is not None and info.last_ordinal >= len(succeeded)
        assert info.last_ordinal <= len(succeeded) + len(failures)
        assert set(succeeded) <= set(stored)
        print(f"{len(succeeded)} appends acknowledged, {len(failures)} refused while connections were terminated")


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_server_down_while_a_subscription_waits_then_recovers(running: PostgresServer, how: str) -> None:
    name = f"t-{uuid.uuid4().hex}"
    with connect(running.url, connect_timeout=2) as backend, connect(running.url, connect_timeout=2) as writer:
        reread = hooks.driver(backend).reread_interval
        topic = backend.topic(name)
        topic.append(b"before")
        subscription = topic.subscribe_from_beginning()
        subscription.__enter__()
        assert isinstance(subscription.receive(timeout=2), DurableStreamRecord)
        outcome: list[object] = []
        raised_at: list[float] = []

        def wait_in_receive() -> None:
            try:
                while True:
                    result = subscription.receive(timeout=10)
                    if result is not None:
                        outcome.append(result)
                        return
            except BaseException as exc:
                raised_at.append(time.monotonic())
                outcome.append(exc)

        waiter = threading.Thread(target=wait_in_receive)
        waiter.start()
        wait_until(lambda: blocked_in_wait(waiter), timeout=5, what="receive() to block")
        assert not outcome, "receive() returned before the server went down"
        stopped_at = time.monotonic()
        if how == "stop":
            running.stop(mode="fast")
        else:
            running.kill()
        running.wait_until_down()
        waiter.join(reread)
        assert outcome and type(outcome[0]) is DurableStreamUnavailableError, outcome
        # Told by the broken hint connection or the head check, not left to the last-resort re-read.
        assert raised_at[0] - stopped_at < reread / 2
        assert subscription.receive(timeout=0) is CLOSED
        assert subscription.receive(timeout=0.1) is CLOSED

        with pytest.raises(DurableStreamUnavailableError) as caught:
            topic.append(b"while down")
        assert type(caught.value) is DurableStreamUnavailableError
        with pytest.raises(DurableStreamUnavailableError):
            topic.subscribe_from_tail()
        with pytest.raises(DurableStreamUnavailableError):
            backend.admin.topic_info(name)

        running.start()
        # The same backend objects work again once the server is back: dead pooled connections are
        # discarded at checkout and the hint connection reconnects.
        topic.append(b"after")
        with topic.subscribe_from_beginning() as again:
            payloads = []
            while len(payloads) < 2:
                result = again.receive(timeout=5)
                assert result is not None and result is not CLOSED
                payloads.append(result.payload)
            assert payloads == [b"before", b"after"]
            started = time.monotonic()
            writer.topic(name).append(b"from another backend")
            result = again.receive(timeout=reread)
            assert isinstance(result, DurableStreamRecord) and result.payload == b"from another backend"
            # The hint connection is back: a wake-up, not the last-resort re-read.
            assert time.monotonic() - started < reread / 2
