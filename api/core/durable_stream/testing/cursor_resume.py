"""Cursor resumption: strictly after the cursor, exactly the suffix, on any backend object."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from api.core.durable_stream import DurableStreamBackend, DurableStreamTopic

from .base import ContractBase
from .helpers import append_all, assert_idle, drain, payloads


class CursorResumeContract(ContractBase):
    def test_every_record_carries_a_string_cursor(self, topic: DurableStreamTopic) -> None:
        append_all(topic, payloads(3))
        with topic.subscribe_from_beginning() as subscription:
            for record in drain(subscription, 3):
                assert isinstance(record.cursor, str) and record.cursor

    def test_disconnect_after_a_record_and_resume_from_the_next(self, topic: DurableStreamTopic) -> None:
        append_all(topic, payloads(5))
        with topic.subscribe_from_beginning() as subscription:
            last = drain(subscription, 2)[-1]
        append_all(topic, [b"r5"])
        with topic.subscribe_from_cursor(last.cursor) as resumed:
            assert [r.payload for r in drain(resumed, 4)] == [b"r2", b"r3", b"r4", b"r5"]
            assert_idle(resumed)

    def test_resume_from_every_position_delivers_exactly_the_suffix(
        self, open_backend: Callable[..., DurableStreamBackend], topic_name: str
    ) -> None:
        # Every one of 1,000 cursors resumes strictly after its record; the whole suffix (to the
        # topic's end, and nothing more) is drained from every 10th position and the last 20, the
        # first records of it from all the others: all 1,000 full suffixes are half a million
        # deliveries per adapter and mode, which the contract suite cannot afford on every run.
        count = 1000
        backend = open_backend(buffer_size=count)
        topic = backend.topic(topic_name)
        # The short checks read through a backend object with small batches, so that they do not
        # fetch the whole suffix anyway (a memory store is private to its backend object, and cheap).
        short = topic if self.store_in_process else open_backend(buffer_size=4).topic(topic_name)
        items = payloads(count)
        append_all(topic, items)
        with topic.subscribe_from_beginning() as subscription:
            cursors = [r.cursor for r in drain(subscription, count)]
        for index, cursor in enumerate(cursors):
            rest = count - index - 1
            whole = index % 10 == 0 or rest < 20
            with (topic if whole else short).subscribe_from_cursor(cursor) as resumed:
                suffix = [r.payload for r in drain(resumed, rest if whole else 3)]
                expected = items[index + 1 :] if whole else items[index + 1 : index + 4]
                assert suffix == expected, f"resume after record {index} delivered the wrong suffix"
                if whole:
                    assert resumed.receive(timeout=0) is None

    def test_resume_from_the_tail_cursor_waits_for_new_records(self, topic: DurableStreamTopic) -> None:
        append_all(topic, payloads(3))
        with topic.subscribe_from_beginning() as subscription:
            last = drain(subscription, 3)[-1]
        with topic.subscribe_from_cursor(last.cursor) as resumed:
            assert_idle(resumed)
            topic.append(b"next")
            assert [r.payload for r in drain(resumed, 1)] == [b"next"]

    def test_the_same_cursor_resumes_more_than_once(self, topic: DurableStreamTopic) -> None:
        append_all(topic, payloads(4))
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 1)[0].cursor
        for _ in range(3):
            with topic.subscribe_from_cursor(cursor) as resumed:
                assert [r.payload for r in drain(resumed, 3)] == [b"r1", b"r2", b"r3"]

    def test_a_cursor_resumes_through_another_backend_object(
        self, open_backend: Callable[..., DurableStreamBackend], backend: DurableStreamBackend, topic_name: str
    ) -> None:
        if self.store_in_process:
            pytest.skip("a memory store is private to its backend object")
        topic = backend.topic(topic_name)
        append_all(topic, payloads(3))
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 1)[0].cursor
        other = open_backend().topic(topic_name)
        with other.subscribe_from_cursor(cursor) as resumed:
            assert [r.payload for r in drain(resumed, 2)] == [b"r1", b"r2"]
