"""Append and ordering: dense topic order, independent subscriptions, concurrent producers."""

from __future__ import annotations

import threading

import pytest

from api.core.durable_stream import DurableStreamBackend, DurableStreamTopic

from .base import ContractBase
from .helpers import append_all, drain, payloads


class AppendOrderContract(ContractBase):
    def test_append_returns_none_and_records_arrive_in_order(self, topic: DurableStreamTopic) -> None:
        items = payloads(20)
        for item in items:
            assert topic.append(item) is None
        with topic.subscribe_from_beginning() as subscription:
            assert [record.payload for record in drain(subscription, 20)] == items

    def test_two_subscriptions_receive_the_same_records_in_the_same_order(self, topic: DurableStreamTopic) -> None:
        first = topic.subscribe_from_tail()
        second = topic.subscribe_from_tail()
        with first, second:
            items = payloads(50)
            append_all(topic, items)
            assert [r.payload for r in drain(first, 50)] == items
            assert [r.payload for r in drain(second, 50)] == items

    def test_producer_view_appends_to_the_same_topic(self, topic: DurableStreamTopic) -> None:
        producer = topic.as_producer()
        assert not hasattr(producer, "subscribe_from_tail")
        with topic.subscribe_from_tail() as subscription:
            producer.append(b"via-producer")
            topic.append(b"via-topic")
            assert [r.payload for r in drain(subscription, 2)] == [b"via-producer", b"via-topic"]

    def test_payload_bytes_are_preserved_exactly(self, topic: DurableStreamTopic) -> None:
        items = [b"", b"\x00\xff\x00", bytes(range(256)), "ünïcødé".encode(), b"x" * 65536]
        append_all(topic, items)
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, len(items))] == items

    def test_topics_are_isolated(self, backend: DurableStreamBackend, topic_name: str) -> None:
        one, other = backend.topic(topic_name), backend.topic(topic_name + "-other")
        one.append(b"one")
        other.append(b"other")
        with one.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 1)] == [b"one"]
            assert subscription.receive(timeout=0.05) is None

    def test_a_second_backend_object_sees_the_same_topic(
        self, open_backend: object, backend: DurableStreamBackend, topic_name: str
    ) -> None:
        if self.store_in_process:
            pytest.skip("a memory store is private to its backend object")
        other = open_backend()  # type: ignore[operator]
        with other.topic(topic_name).subscribe_from_tail() as subscription:
            backend.topic(topic_name).append(b"across")
            assert [r.payload for r in drain(subscription, 1)] == [b"across"]

    def test_concurrent_producers_yield_one_total_order(self, backend: DurableStreamBackend, topic_name: str) -> None:
        producers, per_producer = 8, 250
        topic = backend.topic(topic_name)
        readers = [topic.subscribe_from_tail() for _ in range(2)]
        for reader in readers:
            reader.__enter__()
        try:
            start = threading.Barrier(producers)
            errors: list[BaseException] = []

            def produce(index: int) -> None:
                view = topic.as_producer()
                try:
                    start.wait()
                    for sequence in range(per_producer):
                        view.append(f"{index}:{sequence}".encode())
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
            for thread in threads:
                thread.start()
            seen = [[r.payload for r in drain(reader, producers * per_producer, timeout=120)] for reader in readers]
            for thread in threads:
                thread.join()
            assert not errors
            assert seen[0] == seen[1], "two subscriptions disagree about the order"
            assert len(set(seen[0])) == producers * per_producer
            last_seen = [-1] * producers
            for payload in seen[0]:
                index, sequence = map(int, payload.split(b":"))
                assert sequence == last_seen[index] + 1, "one producer's appends arrived out of its own order"
                last_seen[index] = sequence
        finally:
            for reader in readers:
                reader.close()
