"""Faults on a private Redis server: killed, paused, unreachable. Only contract errors come out.

Every test starts its own ``redis-server`` on a free loopback port and kills it itself; the shared
server is never touched. Each asserts the exact exception type, so a ``redis.exceptions.*`` that
escaped the adapter would fail the test.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from api.core.durable_stream import (
    CLOSED,
    DurableStreamError,
    DurableStreamUnavailableError,
    TopicSealedError,
    connect,
)
from api.core.durable_stream.testing.helpers import blocked_in_wait, drain, drain_until_closed
from harness.redis_server import RedisServer, free_port, redis_available
from harness.waiting import wait_until
from tests.durable_stream import hooks

#: How long a ``receive()`` of these tests waits at most: what "at once" is measured against.
WAIT = 30.0
#: The head check's period of a reader whose test proves that a hint, not the check, delivered.
HEAD_CHECK = 20.0

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is needed")


def assert_contract_error(exc: BaseException, expected: type[DurableStreamError]) -> None:
    assert type(exc) is expected, f"{type(exc).__module__}.{type(exc).__name__} escaped: {exc}"
    assert not type(exc).__module__.startswith("redis")


def test_server_killed_while_a_subscription_waits(server: RedisServer) -> None:
    with connect(server.url) as backend:
        topic = backend.topic("waiting")
        topic.append(b"one")
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 1)] == [b"one"]
            outcome: list[object] = []
            raised_at: list[float] = []

            def wait() -> None:
                try:
                    outcome.append(subscription.receive(timeout=30))
                except BaseException as exc:
                    outcome.append(exc)
                raised_at.append(time.monotonic())

            waiter = threading.Thread(target=wait)
            waiter.start()
            wait_until(lambda: blocked_in_wait(waiter), timeout=5, what="receive() to block")
            assert not outcome, "receive() returned before the server was killed"
            killed_at = time.monotonic()
            server.kill()
            waiter.join(timeout=10)
            assert outcome, "receive() did not return"
            assert isinstance(outcome[0], BaseException)
            assert_contract_error(outcome[0], DurableStreamUnavailableError)
            assert raised_at[0] - killed_at < 2.0, f"took {raised_at[0] - killed_at:.2f} s"
            assert subscription.receive(timeout=0) is CLOSED
            assert subscription.receive(timeout=0.1) is CLOSED


def test_server_killed_while_many_subscriptions_wait_on_many_topics(server: RedisServer) -> None:
    with connect(server.url) as backend:
        subscriptions = [backend.topic(f"t{i % 5}").subscribe_from_tail() for i in range(20)]
        for subscription in subscriptions:
            subscription.__enter__()
        pending = object()
        results: list[object] = [pending] * len(subscriptions)

        def wait(index: int) -> None:
            try:
                results[index] = subscriptions[index].receive(timeout=WAIT)
            except BaseException as exc:
                results[index] = exc

        waiters = [threading.Thread(target=wait, args=(i,)) for i in range(len(subscriptions))]
        for waiter in waiters:
            waiter.start()
        wait_until(lambda: all(map(blocked_in_wait, waiters)), timeout=5, what="every receive() to block")
        assert all(result is pending for result in results), "a receive() returned before the server was killed"
        killed_at = time.monotonic()
        server.kill()
        for waiter in waiters:
            waiter.join(timeout=WAIT / 2)
        # Told by the broken connection, not by the end of their wait.
        assert time.monotonic() - killed_at < WAIT / 2
        for result in results:
            assert isinstance(result, BaseException)
            assert_contract_error(result, DurableStreamUnavailableError)


def test_server_killed_during_appends(server: RedisServer) -> None:
    with connect(server.url) as backend:
        topic = backend.topic("appending")
        appended = 0
        failure: list[BaseException] = []

        def produce() -> None:
            nonlocal appended
            try:
                while True:
                    topic.append(b"x" * 200)
                    appended += 1
            except BaseException as exc:
                failure.append(exc)

        producer = threading.Thread(target=produce)
        producer.start()
        wait_until(lambda: appended > 200, timeout=10.0, what="appends to flow")
        server.kill()
        producer.join(timeout=10)
        assert failure, "append() kept succeeding against a dead server"
        assert_contract_error(failure[0], DurableStreamUnavailableError)
        for operation in (lambda: topic.append(b"y"), topic.seal, topic.subscribe_from_tail):
            with pytest.raises(DurableStreamError) as raised:
                operation()
            assert_contract_error(raised.value, DurableStreamUnavailableError)
        with pytest.raises(DurableStreamError) as raised:
            backend.admin.topic_info("appending")
        assert_contract_error(raised.value, DurableStreamUnavailableError)


def test_paused_server_times_out_as_unavailable(server: RedisServer) -> None:
    assert server.process is not None
    socket_timeout = 0.3
    with connect(server.url, socket_timeout=socket_timeout) as backend:
        topic = backend.topic("paused")
        topic.append(b"before")
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(DurableStreamError) as raised:
                topic.append(b"during")
            assert_contract_error(raised.value, DurableStreamUnavailableError)
            # A bounded number of attempts, each ended by the socket timeout, not a wait for the server.
            assert time.monotonic() - started < 30 * socket_timeout
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        # The timed-out connection is discarded, not reused out of step with its replies. The
        # timed-out append may or may not have been stored: that is what the error means.
        topic.append(b"after")
        topic.seal()
        with topic.subscribe_from_beginning() as subscription:
            payloads = [r.payload for r in drain_until_closed(subscription)]
        assert payloads in ([b"before", b"after"], [b"before", b"during", b"after"])


def test_unreachable_server_at_connect() -> None:
    with pytest.raises(DurableStreamError) as raised:
        connect(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    assert_contract_error(raised.value, DurableStreamUnavailableError)


def test_subscriptions_recover_after_a_restart_with_aof() -> None:
    """After a restart, new work on the same backend object flows again, wake-ups included."""
    with RedisServer(appendonly=True) as server, connect(server.url, poll_interval=HEAD_CHECK) as backend:
        topic = backend.topic("recovering")
        topic.append(b"before")
        server.restart()
        with topic.subscribe_from_tail() as subscription:
            wait_until(lambda: _feed_linked(backend), timeout=10.0, what="the shared reader to reconnect")
            with connect(server.url) as other:
                started = time.monotonic()
                other.topic("recovering").append(b"after")
                assert [r.payload for r in drain(subscription, 1)] == [b"after"]
                # Through the hint, not the head check (every HEAD_CHECK seconds here).
                assert time.monotonic() - started < HEAD_CHECK / 2
        topic.seal()
        with pytest.raises(TopicSealedError):
            topic.append(b"sealed")


@pytest.mark.parametrize("appendonly", [False, True], ids=["without-persistence", "with-aof"])
def test_topic_info_epoch_tells_whether_the_topic_survived_a_restart(appendonly: bool) -> None:
    with RedisServer(appendonly=appendonly) as server, connect(server.url) as backend:
        topic = backend.topic("restarted")
        topic.append(b"before")
        before = backend.admin.topic_info("restarted")
        assert before is not None
        server.restart()
        # The pooled connections were cut by the restart: wait until a call gets through again.
        wait_until(lambda: _answers(backend), timeout=10.0, what="the restarted server to answer")
        if not appendonly:
            assert backend.admin.topic_info("restarted") is None
            topic.append(b"after")
        after = backend.admin.topic_info("restarted")
        assert after is not None
        assert (after.epoch == before.epoch) is appendonly


def _answers(backend: object) -> bool:
    try:
        backend.admin.topic_info("restarted")  # type: ignore[attr-defined]
    except DurableStreamUnavailableError:
        return False
    return True


def _feed_linked(backend: object) -> bool:
    feeds = hooks.redis_feeds(backend)  # type: ignore[arg-type]
    return bool(feeds) and all(feed.link_count() > 0 for feed in feeds)
