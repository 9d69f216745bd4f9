"""Retention and gaps: a removed position is an error, never a skip to a later record."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from api.core.durable_stream import CLOSED, CursorUnavailableError, DurableStreamBackend, DurableStreamTopic

from .base import ContractBase
from .helpers import append_all, drain, expect_cursor_unavailable, payloads, wait_until


class RetentionContract(ContractBase):
    def test_topic_info_reports_length_ordinals_and_seal(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        assert backend.admin.topic_info(topic_name) is None
        append_all(topic, payloads(7))
        backend.admin.trim_topic(topic_name, keep_last=5)
        info = backend.admin.topic_info(topic_name)
        assert info is not None
        assert (info.length, info.first_ordinal, info.last_ordinal, info.sealed) == (5, 3, 7, False)
        topic.seal()
        info = backend.admin.topic_info(topic_name)
        assert info is not None and info.sealed

    def test_topic_info_epoch_is_stable_for_the_life_of_the_topic(
        self, open_backend: Callable[..., DurableStreamBackend], backend: DurableStreamBackend, topic_name: str
    ) -> None:
        topic = backend.topic(topic_name)
        topic.subscribe_from_tail().close()  # creates the topic, and with it the epoch, before any append
        info = backend.admin.topic_info(topic_name)
        assert info is not None
        epoch = info.epoch
        assert isinstance(epoch, str) and epoch
        append_all(topic, payloads(5))
        assert _epoch(backend, topic_name) == epoch
        backend.admin.trim_topic(topic_name, keep_last=2)
        assert _epoch(backend, topic_name) == epoch
        topic.seal()
        assert _epoch(backend, topic_name) == epoch
        if not self.store_in_process:  # a memory store is private to its backend object
            assert _epoch(open_backend(), topic_name) == epoch

    def test_topic_info_epoch_changes_when_the_topic_is_deleted_and_recreated(
        self, open_backend: Callable[..., DurableStreamBackend], backend: DurableStreamBackend, topic_name: str
    ) -> None:
        topic = backend.topic(topic_name)
        append_all(topic, payloads(3))
        first = _epoch(backend, topic_name)
        assert backend.admin.delete_topic(topic_name)
        assert backend.admin.topic_info(topic_name) is None
        topic.append(b"again")
        info = backend.admin.topic_info(topic_name)
        assert info is not None and (info.length, info.last_ordinal) == (1, 1)
        assert isinstance(info.epoch, str) and info.epoch and info.epoch != first
        if not self.store_in_process:
            assert _epoch(open_backend(), topic_name) == info.epoch

    def test_resume_from_a_trimmed_cursor_is_refused(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(10))
        with topic.subscribe_from_beginning() as subscription:
            cursors = [r.cursor for r in drain(subscription, 10)]
        assert backend.admin.trim_topic(topic_name, keep_last=5) == 5
        for cursor in cursors[:4]:
            expect_cursor_unavailable(topic, cursor)
        with topic.subscribe_from_cursor(cursors[4]) as resumed:  # the next record (r5) is retained
            assert [r.payload for r in drain(resumed, 5)] == payloads(10)[5:]

    def test_trim_under_a_live_slow_subscriber_raises_instead_of_skipping(
        self, open_backend: Callable[..., DurableStreamBackend], topic_name: str
    ) -> None:
        backend = open_backend(buffer_size=2)
        topic = backend.topic(topic_name)
        append_all(topic, payloads(10))
        with topic.subscribe_from_beginning() as subscription:
            received = drain(subscription, 1)
            backend.admin.trim_topic(topic_name, keep_last=3)
            with pytest.raises(CursorUnavailableError):
                while True:  # records already buffered may still come, but never r7 after a gap
                    result = subscription.receive(timeout=1.0)
                    assert result is not None and result is not CLOSED
                    received.append(result)
                    assert result.payload == f"r{len(received) - 1}".encode()
            assert subscription.receive(timeout=0) is CLOSED
            assert subscription.receive(timeout=0.01) is CLOSED

    def test_trim_to_empty_keeps_the_tail_resumable(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(3))
        with topic.subscribe_from_beginning() as subscription:
            cursors = [r.cursor for r in drain(subscription, 3)]
        backend.admin.trim_topic(topic_name, keep_last=0)
        expect_cursor_unavailable(topic, cursors[1])
        with topic.subscribe_from_cursor(cursors[2]) as resumed:
            topic.append(b"r3")
            assert [r.payload for r in drain(resumed, 1)] == [b"r3"]
        with topic.subscribe_from_beginning() as fresh:
            assert [r.payload for r in drain(fresh, 1)] == [b"r3"]

    def test_deleted_and_recreated_topic_refuses_old_cursors(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(3))
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 1)[0].cursor
        live = topic.subscribe_from_tail()
        live.__enter__()
        assert backend.admin.delete_topic(topic_name) is True
        assert backend.admin.delete_topic(topic_name) is False
        append_all(topic, payloads(5))  # a new incarnation, longer than the old one
        expect_cursor_unavailable(topic, cursor)
        with pytest.raises(CursorUnavailableError):
            while live.receive(timeout=1.0) is not CLOSED:
                pass
        live.close()

    def test_max_records_keeps_only_the_newest(
        self, open_backend: Callable[..., DurableStreamBackend], topic_name: str
    ) -> None:
        backend = open_backend(max_records=5)
        topic = backend.topic(topic_name)
        append_all(topic, payloads(12))
        backend.admin.enforce_retention()
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 5)] == payloads(12)[7:]
        info = backend.admin.topic_info(topic_name)
        assert info is not None and (info.first_ordinal, info.last_ordinal) == (8, 12)

    def test_max_age_removes_old_records_and_old_cursors_fail(
        self, open_backend: Callable[..., DurableStreamBackend], topic_name: str
    ) -> None:
        backend = open_backend(max_age_seconds=1)
        topic = backend.topic(topic_name)
        append_all(topic, payloads(3))
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 1)[0].cursor
        started = time.monotonic()

        def expired() -> bool:
            backend.admin.enforce_retention()
            info = backend.admin.topic_info(topic_name)
            return info is None or info.length == 0

        wait_until(expired, timeout=15, what="records older than max_age_seconds to be removed")
        assert time.monotonic() - started >= 0.5, "records were removed long before max_age_seconds"
        expect_cursor_unavailable(topic, cursor)


def _epoch(backend: DurableStreamBackend, topic_name: str) -> str:
    info = backend.admin.topic_info(topic_name)
    assert info is not None
    return info.epoch
