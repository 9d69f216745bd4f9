"""Start positions: boundaries are fixed before ``subscribe_*`` returns and never move afterwards."""

from __future__ import annotations

import threading
import time

from api.core.durable_stream import DurableStreamBackend, DurableStreamTopic

from .base import ContractBase
from .helpers import append_all, assert_idle, drain, payloads, wait_until


class StartPositionContract(ContractBase):
    def test_from_beginning_starts_at_the_earliest_record(self, topic: DurableStreamTopic) -> None:
        append_all(topic, payloads(5))
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 5)] == payloads(5)
            assert_idle(subscription)

    def test_from_beginning_fixes_the_earliest_retained_record_at_call_time(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(10))
        backend.admin.trim_topic(topic_name, keep_last=4)
        subscription = topic.subscribe_from_beginning()
        topic.append(b"r10")
        with subscription:
            assert [r.payload for r in drain(subscription, 5)] == [b"r6", b"r7", b"r8", b"r9", b"r10"]

    def test_from_beginning_on_an_empty_topic_receives_the_first_record(self, topic: DurableStreamTopic) -> None:
        subscription = topic.subscribe_from_beginning()
        topic.append(b"first")
        with subscription:
            assert [r.payload for r in drain(subscription, 1)] == [b"first"]

    def test_from_tail_skips_earlier_records(self, topic: DurableStreamTopic) -> None:
        append_all(topic, payloads(5, "old"))
        with topic.subscribe_from_tail() as subscription:
            assert_idle(subscription)
            topic.append(b"new")
            assert [r.payload for r in drain(subscription, 1)] == [b"new"]
            assert_idle(subscription)

    def test_record_appended_between_subscribe_from_tail_and_enter_is_delivered(
        self, topic: DurableStreamTopic
    ) -> None:
        topic.append(b"before")
        subscription = topic.subscribe_from_tail()
        topic.append(b"between")
        with subscription:
            topic.append(b"after")
            assert [r.payload for r in drain(subscription, 2)] == [b"between", b"after"]

    def test_enter_does_not_advance_a_boundary_fixed_long_before(self, topic: DurableStreamTopic) -> None:
        subscription = topic.subscribe_from_tail()
        append_all(topic, payloads(300))
        with subscription:
            assert [r.payload for r in drain(subscription, 300)] == payloads(300)

    def test_tail_race_with_a_concurrent_appender(self, topic: DurableStreamTopic) -> None:
        """Many iterations of subscribe_from_tail() racing a producer: no loss, no stale record."""
        started = 0
        completed = 0
        stop = threading.Event()
        errors: list[BaseException] = []

        def produce() -> None:
            nonlocal started, completed
            try:
                while not stop.is_set():
                    started += 1
                    topic.append(str(started).encode())
                    completed = started
                    time.sleep(0)  # lets other greenlets run when gevent is patched in
            except BaseException as exc:
                errors.append(exc)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            wait_until(lambda: completed > 0, timeout=10.0, what="the producer to start")
            for _ in range(60):
                done_before = completed
                subscription = topic.subscribe_from_tail()
                started_after = started
                wait_until(
                    lambda: completed >= started_after + 2,  # noqa: B023  (waited for before the loop goes on)
                    timeout=10.0,
                    what="appends after the boundary",
                )
                with subscription:
                    numbers = [int(r.payload) for r in drain(subscription, 3)]
                assert numbers[0] > done_before, "a record completed before the boundary was replayed"
                assert numbers[0] <= started_after + 1, "a record appended after the boundary was lost"
                assert numbers == list(range(numbers[0], numbers[0] + 3))
        finally:
            stop.set()
            producer.join()
        assert not errors
