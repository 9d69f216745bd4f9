"""Lifecycle: one-shot entry, idempotent close from any thread, terminal errors close for good."""

from __future__ import annotations

import threading
import time

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamTopic,
    DurableStreamUnavailableError,
)

from . import probes
from .base import ContractBase
from .helpers import drain, expect_cursor_unavailable, wait_until, waiting_in_receive


class CloseAndThreadsContract(ContractBase):
    def test_close_from_another_thread_unblocks_receive_within_100ms(self, topic: DurableStreamTopic) -> None:
        subscription = topic.subscribe_from_tail()
        subscription.__enter__()
        closed_at: list[float] = []
        receiver = threading.current_thread()

        def close_soon() -> None:
            wait_until(lambda: waiting_in_receive(subscription, receiver), timeout=10.0, what="receive() to block")
            closed_at.append(time.monotonic())
            subscription.close()

        closer = threading.Thread(target=close_soon)
        closer.start()
        result = subscription.receive(timeout=30)
        returned_at = time.monotonic()
        closer.join()
        assert result is CLOSED
        assert returned_at - closed_at[0] < 0.1
        assert subscription.receive(timeout=0) is CLOSED

    def test_close_is_idempotent_and_returns_none(self, topic: DurableStreamTopic) -> None:
        subscription = topic.subscribe_from_tail()
        assert subscription.close() is None
        assert subscription.close() is None
        entered = topic.subscribe_from_tail()
        with entered:
            assert entered.close() is None
        assert entered.close() is None

    def test_a_subscription_is_entered_at_most_once(self, topic: DurableStreamTopic) -> None:
        subscription = topic.subscribe_from_tail()
        with subscription, pytest.raises(DurableStreamUnavailableError):
            subscription.__enter__()
        with pytest.raises(DurableStreamUnavailableError):
            subscription.__enter__()
        closed_first = topic.subscribe_from_tail()
        closed_first.close()
        with pytest.raises(DurableStreamUnavailableError):
            closed_first.__enter__()

    def test_failed_enter_cannot_be_retried_and_releases_resources(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        expect_cursor_unavailable(topic, "1.not-a-cursor")
        topic.append(b"r0")
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 1)[0].cursor
        # The cursor follows r0; it stays valid until r1, the record after it, is trimmed too.
        topic.append(b"r1")
        backend.admin.trim_topic(topic_name, keep_last=0)
        stale = topic.subscribe_from_cursor(cursor)
        with pytest.raises(CursorUnavailableError):
            stale.__enter__()
        with pytest.raises(DurableStreamUnavailableError):
            stale.__enter__()
        assert stale.receive(timeout=0) is CLOSED
        assert not probes.registered_topics(backend), "a failed __enter__ left a registration behind"

    def test_closing_one_subscription_does_not_disturb_another(self, topic: DurableStreamTopic) -> None:
        kept, closed = topic.subscribe_from_tail(), topic.subscribe_from_tail()
        with kept, closed:
            closer = threading.Timer(0.1, closed.close)
            closer.start()
            assert closed.receive(timeout=10) is CLOSED
            closer.join()
            topic.append(b"still")
            assert [r.payload for r in drain(kept, 1)] == [b"still"]

    def test_receive_before_enter_is_an_error_that_closes(self, topic: DurableStreamTopic) -> None:
        subscription = topic.subscribe_from_tail()
        with pytest.raises(DurableStreamUnavailableError):
            subscription.receive(timeout=0)
        assert subscription.receive(timeout=0) is CLOSED

    def test_receive_timeout_returns_none_without_waiting_much_longer(self, topic: DurableStreamTopic) -> None:
        with topic.subscribe_from_tail() as subscription:
            started = time.monotonic()
            assert subscription.receive(timeout=0.3) is None
            elapsed = time.monotonic() - started
            assert 0.25 <= elapsed < 1.5
            assert subscription.receive(timeout=0) is None

    def test_closing_the_backend_closes_its_subscriptions(self, open_backend: object, topic_name: str) -> None:
        backend = open_backend()  # type: ignore[operator]
        topic = backend.topic(topic_name)
        subscription = topic.subscribe_from_tail()
        subscription.__enter__()
        waiter_result: list[object] = []
        returned_at: list[float] = []

        def wait() -> None:
            waiter_result.append(subscription.receive(timeout=30))
            returned_at.append(time.monotonic())

        waiter = threading.Thread(target=wait)
        waiter.start()
        wait_until(lambda: waiting_in_receive(subscription, waiter), timeout=10.0, what="receive() to block")
        assert not returned_at, "receive() returned before the backend was closed"
        closed_at = time.monotonic()
        backend.close()
        waiter.join(timeout=5)
        assert waiter_result == [CLOSED]
        assert returned_at[0] - closed_at < 1.0, "closing the backend did not wake the blocked receive()"
        with pytest.raises(DurableStreamUnavailableError):
            topic.append(b"after close")
        with pytest.raises(DurableStreamUnavailableError):
            topic.subscribe_from_tail()
        backend.close()

    def test_many_threads_each_with_their_own_subscription(self, topic: DurableStreamTopic) -> None:
        readers, count = 16, 200
        subscriptions = [topic.subscribe_from_tail() for _ in range(readers)]
        results: list[list[bytes]] = [[] for _ in range(readers)]
        errors: list[BaseException] = []

        def read(index: int) -> None:
            try:
                with subscriptions[index] as subscription:
                    results[index] = [r.payload for r in drain(subscription, count, timeout=60)]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
        for thread in threads:
            thread.start()
        expected = [str(i).encode() for i in range(count)]
        for payload in expected:
            topic.append(payload)
        for thread in threads:
            thread.join(timeout=90)
        assert not errors
        assert all(result == expected for result in results)
