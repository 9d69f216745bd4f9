"""Faults on a private NATS server: killed, restarted with and without its data.

Every test starts its own ``nats-server`` (JetStream, a free loopback port) and kills it itself.
Each asserts the exact exception type, so a ``nats.errors.*`` or ``nats.js.errors.*`` that escaped
the adapter would fail the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamError,
    DurableStreamUnavailableError,
    connect,
)
from api.core.durable_stream.testing.helpers import drain, waiting_in_receive
from harness.nats_server import NatsServer
from harness.waiting import wait_until


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


def assert_contract_error(exc: BaseException, expected: type[DurableStreamError]) -> None:
    assert type(exc) is expected, f"{type(exc).__module__}.{type(exc).__name__} escaped: {exc}"


def test_server_killed_while_a_subscription_waits(nats_server: NatsServer) -> None:
    with connect(nats_server.url) as backend:
        topic = backend.topic("waiting")
        topic.append(b"one")
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 1)] == [b"one"]
            outcome: list[object] = []
            returned_at: list[float] = []

            def wait() -> None:
                try:
                    outcome.append(subscription.receive(timeout=30))
                except BaseException as exc:
                    outcome.append(exc)
                returned_at.append(time.monotonic())

            waiter = threading.Thread(target=wait)
            waiter.start()
            wait_until(lambda: waiting_in_receive(subscription, waiter), timeout=5, what="receive() to block")
            killed_at = time.monotonic()
            nats_server.kill()
            waiter.join(timeout=10)
            assert outcome, "receive() did not return"
            assert isinstance(outcome[0], BaseException), outcome
            assert_contract_error(outcome[0], DurableStreamUnavailableError)
            assert returned_at[0] - killed_at < 2.0
            assert subscription.receive(timeout=0) is CLOSED


def test_server_killed_during_appends(nats_server: NatsServer) -> None:
    with connect(nats_server.url) as backend:
        topic = backend.topic("appending")
        failures: list[BaseException] = []
        acknowledged: list[int] = []

        def append() -> None:
            for index in range(1_000_000):
                try:
                    topic.append(str(index).encode())
                except BaseException as exc:
                    failures.append(exc)
                    return
                acknowledged.append(index)

        appender = threading.Thread(target=append)
        appender.start()
        wait_until(lambda: len(acknowledged) > 50, timeout=10, what="appends to be acknowledged")
        nats_server.kill()
        appender.join(timeout=10)
        assert failures, "append() did not fail"
        assert_contract_error(failures[0], DurableStreamUnavailableError)
        with pytest.raises(DurableStreamUnavailableError) as raised:
            topic.append(b"while down")
        assert_contract_error(raised.value, DurableStreamUnavailableError)
        with pytest.raises(DurableStreamUnavailableError):
            topic.subscribe_from_tail()


def test_restart_with_file_storage_resumes_with_nothing_lost(nats_server: NatsServer) -> None:
    with connect(nats_server.url, storage="file") as backend:
        topic = backend.topic("durable")
        for index in range(20):
            topic.append(f"r{index}".encode())
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 10)[-1].cursor
        nats_server.restart(kill=True)

        def appended() -> bool:
            try:
                topic.append(b"after restart")
            except DurableStreamUnavailableError:
                return False
            return True

        wait_until(appended, timeout=20, what="the backend to reconnect")
        with topic.subscribe_from_cursor(cursor) as resumed:
            payloads = [r.payload for r in drain(resumed, 11)]
        assert payloads == [f"r{index}".encode() for index in range(10, 20)] + [b"after restart"]
        info = backend.admin.topic_info("durable")
        assert info is not None and (info.first_ordinal, info.last_ordinal) == (1, 21)


def test_restart_with_memory_storage_makes_old_cursors_unavailable(nats_server: NatsServer) -> None:
    with connect(nats_server.url, storage="memory", stream="MEMORY", subject_prefix="mem") as backend:
        topic = backend.topic("volatile")
        for index in range(5):
            topic.append(f"r{index}".encode())
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 3)[-1].cursor
        live = topic.subscribe_from_cursor(cursor)
        live.__enter__()
        nats_server.restart(kill=True)

        def subscribed() -> bool:
            try:
                topic.subscribe_from_cursor(cursor).__enter__()
            except CursorUnavailableError:
                return True
            except DurableStreamUnavailableError:
                return False  # still reconnecting
            raise AssertionError("a cursor of the lost history was accepted")

        wait_until(subscribed, timeout=20, what="the backend to reconnect")
        with pytest.raises((CursorUnavailableError, DurableStreamUnavailableError)) as raised:
            for _ in range(100):
                live.receive(timeout=0.2)
        assert type(raised.value) in (CursorUnavailableError, DurableStreamUnavailableError)
        assert live.receive(timeout=0) is CLOSED
        topic.append(b"new history")
        with topic.subscribe_from_beginning() as fresh:
            assert [r.payload for r in drain(fresh, 1)] == [b"new history"]
