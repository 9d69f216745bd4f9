"""Error mapping: bad cursors and bad calls get named errors; nothing backend-specific leaks."""

from __future__ import annotations

import dataclasses

import pytest

from api.core.durable_stream import (
    DurableStreamBackend,
    DurableStreamRecord,
    DurableStreamTopic,
    DurableStreamUnavailableError,
)

from .base import ContractBase
from .helpers import MALFORMED_CURSORS, append_all, damaged_cursors, drain, expect_cursor_unavailable, payloads


class ErrorMappingContract(ContractBase):
    @pytest.fixture
    def cursor(self, topic: DurableStreamTopic) -> str:
        append_all(topic, payloads(3))
        with topic.subscribe_from_beginning() as subscription:
            return drain(subscription, 1)[0].cursor

    @pytest.mark.parametrize("bad", MALFORMED_CURSORS)
    def test_malformed_cursors_are_refused(self, topic: DurableStreamTopic, bad: str) -> None:
        expect_cursor_unavailable(topic, bad)

    def test_non_string_cursors_are_refused(self, topic: DurableStreamTopic) -> None:
        for bad in (None, 42, b"1.AAAA"):
            expect_cursor_unavailable(topic, bad)  # type: ignore[arg-type]

    def test_truncated_and_altered_cursors_are_refused(self, topic: DurableStreamTopic, cursor: str) -> None:
        for damaged in damaged_cursors(cursor):
            expect_cursor_unavailable(topic, damaged)

    def test_another_topics_cursor_is_refused(
        self, backend: DurableStreamBackend, topic_name: str, cursor: str
    ) -> None:
        other = backend.topic(topic_name + "-other")
        append_all(other, payloads(5))
        expect_cursor_unavailable(other, cursor)

    def test_records_expose_only_payload_and_cursor(self, cursor: str) -> None:
        assert [field.name for field in dataclasses.fields(DurableStreamRecord)] == ["payload", "cursor"]
        assert isinstance(cursor, str)

    def test_invalid_topic_names_and_payloads(self, backend: DurableStreamBackend, topic: DurableStreamTopic) -> None:
        for name in ("", "a\x00b", "x" * 10_000, None, 7):
            with pytest.raises(ValueError):
                backend.topic(name)  # type: ignore[arg-type]
        for payload in ("text", None, 12):
            with pytest.raises(TypeError):
                topic.append(payload)  # type: ignore[arg-type]

    def test_operations_on_a_closed_backend_raise_unavailable(self, open_backend: object, topic_name: str) -> None:
        backend = open_backend()  # type: ignore[operator]
        topic = backend.topic(topic_name)
        topic.append(b"r0")
        backend.close()
        for operation in (
            lambda: topic.append(b"x"),
            topic.seal,
            topic.subscribe_from_tail,
            topic.subscribe_from_beginning,
            lambda: backend.admin.topic_info(topic_name),
        ):
            with pytest.raises(DurableStreamUnavailableError):
                operation()
