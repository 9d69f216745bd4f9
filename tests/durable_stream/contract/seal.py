"""Seal: appends are refused afterwards, and a reader that reaches the end gets ``CLOSED``."""

from __future__ import annotations

import threading
import time

import pytest

from api.core.durable_stream import (
    CLOSED,
    DurableStreamBackend,
    DurableStreamTopic,
    DurableStreamUnavailableError,
    TopicSealedError,
)

from ._base import ContractBase, append_all, drain, drain_until_closed, payloads


class SealContract(ContractBase):
    def test_append_after_seal_raises_and_appends_nothing(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(2))
        topic.seal()
        with pytest.raises(TopicSealedError) as raised:
            topic.append(b"late")
        assert isinstance(raised.value, DurableStreamUnavailableError)
        with pytest.raises(TopicSealedError):
            topic.as_producer().append(b"late")
        info = backend.admin.topic_info(topic_name)
        assert info is not None and info.length == 2 and info.last_ordinal == 2

    def test_seal_is_idempotent(self, topic: DurableStreamTopic) -> None:
        topic.append(b"only")
        topic.seal()
        topic.seal()
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain_until_closed(subscription)] == [b"only"]

    def test_reader_gets_closed_after_the_last_record(self, topic: DurableStreamTopic) -> None:
        with topic.subscribe_from_tail() as subscription:
            append_all(topic, payloads(3))
            topic.seal()
            assert [r.payload for r in drain_until_closed(subscription)] == payloads(3)
            assert subscription.receive(timeout=0) is CLOSED

    def test_seal_wakes_a_waiting_reader(self, topic: DurableStreamTopic) -> None:
        with topic.subscribe_from_tail() as subscription:
            sealer = threading.Timer(0.2, topic.seal)
            sealer.start()
            started = time.monotonic()
            assert subscription.receive(timeout=10) is CLOSED
            assert time.monotonic() - started < 5
            sealer.join()

    def test_sealed_empty_topic_closes_every_new_subscription(self, topic: DurableStreamTopic) -> None:
        topic.seal()
        for subscription in (topic.subscribe_from_beginning(), topic.subscribe_from_tail()):
            with subscription:
                assert subscription.receive(timeout=1) is CLOSED

    def test_resume_from_the_last_cursor_of_a_sealed_topic_closes(self, topic: DurableStreamTopic) -> None:
        append_all(topic, payloads(3))
        topic.seal()
        with topic.subscribe_from_beginning() as subscription:
            records = drain_until_closed(subscription)
        with topic.subscribe_from_cursor(records[-1].cursor) as resumed:
            assert resumed.receive(timeout=1) is CLOSED
        with topic.subscribe_from_cursor(records[0].cursor) as resumed:
            assert [r.payload for r in drain_until_closed(resumed)] == payloads(3)[1:]

    def test_concurrent_appends_and_seal_leave_no_record_after_the_seal(self, topic: DurableStreamTopic) -> None:
        accepted: list[bytes] = []
        refused = threading.Event()

        def produce() -> None:
            for index in range(100_000):
                try:
                    topic.append(str(index).encode())
                except TopicSealedError:
                    refused.set()
                    return
                accepted.append(str(index).encode())
                time.sleep(0)

        producer = threading.Thread(target=produce)
        with topic.subscribe_from_beginning() as subscription:
            producer.start()
            drain(subscription, 20, timeout=30)
            topic.seal()
            producer.join(timeout=60)
            assert refused.is_set()
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain_until_closed(subscription, timeout=60)] == accepted
