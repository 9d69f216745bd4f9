"""Ordinal positions, for gateways that expose ordered offsets: ``admin.create_topic``,
``admin.cursor_position`` (:class:`~api.core.durable_stream.CursorPosition`) and ``admin.cursor_after``.

A cursor maps to its topic's incarnation and a record's ordinal and back exactly; a cursor built from an
ordinal resumes where the delivered cursor of that record does, however far into the topic; and a
position that is not one of this topic's retained positions (malformed, another topic's, another
incarnation's, behind retention or past the tail, or naming another history) is a
:class:`~api.core.durable_stream.CursorUnavailableError`, never a silent fallback.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorPosition,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamTopic,
    TopicCursor,
)

from .base import ContractBase
from .helpers import (
    MALFORMED_CURSORS,
    append_all,
    assert_idle,
    damaged_cursors,
    drain,
    expect_cursor_unavailable,
    payloads,
)

#: Records of a long topic: more than two reads of the default size (128 records) bring.
LONG_TOPIC = 320
#: Topic names the library refuses.
BAD_NAMES: list[object] = ["", "x" * 513, "a\0b", None, 42]


def assert_resumes(topic: DurableStreamTopic, cursor: TopicCursor, expected: list[bytes]) -> None:
    """A subscription from ``cursor`` brings exactly ``expected``, then waits."""
    with topic.subscribe_from_cursor(cursor) as resumed:
        assert [r.payload for r in drain(resumed, len(expected))] == expected
        assert_idle(resumed)


def epoch_of(backend: DurableStreamBackend, name: str) -> str:
    info = backend.admin.topic_info(name)
    assert info is not None
    return info.epoch


class OrdinalCursorContract(ContractBase):
    # create_topic ------------------------------------------------------------------------------

    def test_create_topic_makes_an_empty_unsealed_incarnation(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        assert backend.admin.topic_info(topic_name) is None
        info = backend.admin.create_topic(topic_name)
        assert (info.name, info.length, info.first_ordinal, info.last_ordinal, info.sealed) == (
            topic_name,
            0,
            1,
            0,
            False,
        )
        assert isinstance(info.epoch, str) and info.epoch
        assert backend.admin.topic_info(topic_name) == info
        # The incarnation is the one records then go to: appends keep its epoch, ordinals start at 1.
        with topic.subscribe_from_cursor(backend.admin.cursor_after(topic_name, info.epoch, 0)) as subscription:
            assert_idle(subscription)
            topic.append(b"first")
            record = drain(subscription, 1)[0]
        assert record.payload == b"first"
        assert backend.admin.cursor_position(topic_name, record.cursor) == CursorPosition(info.epoch, 1)

    def test_create_topic_leaves_an_existing_topic_as_it_is(
        self,
        open_backend: Callable[..., DurableStreamBackend],
        backend: DurableStreamBackend,
        topic: DurableStreamTopic,
        topic_name: str,
    ) -> None:
        created = backend.admin.create_topic(topic_name)
        assert backend.admin.create_topic(topic_name) == created
        append_all(topic, payloads(5))
        backend.admin.trim_topic(topic_name, keep_last=3)
        topic.seal()
        info = backend.admin.topic_info(topic_name)
        assert info is not None and (info.length, info.first_ordinal, info.last_ordinal, info.sealed) == (3, 3, 5, True)
        assert backend.admin.create_topic(topic_name) == info
        assert info.epoch == created.epoch
        if not self.store_in_process:  # a memory store is private to its backend object
            assert open_backend().admin.create_topic(topic_name) == info
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 3)] == payloads(5)[2:]
            assert subscription.receive(timeout=5) is CLOSED

    def test_create_topic_after_a_delete_is_a_new_incarnation(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        first = backend.admin.create_topic(topic_name)
        append_all(topic, payloads(3))
        topic.seal()
        assert backend.admin.delete_topic(topic_name)
        second = backend.admin.create_topic(topic_name)
        assert (second.length, second.first_ordinal, second.last_ordinal, second.sealed) == (0, 1, 0, False)
        assert second.epoch and second.epoch != first.epoch
        topic.append(b"again")  # no longer sealed
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 1)] == [b"again"]

    def test_create_topic_refuses_invalid_names(self, backend: DurableStreamBackend) -> None:
        for bad in BAD_NAMES:
            with pytest.raises(ValueError):
                backend.admin.create_topic(bad)  # type: ignore[arg-type]

    # cursor_position ---------------------------------------------------------------------------

    def test_cursor_position_is_the_epoch_and_ordinal_of_each_record(
        self,
        open_backend: Callable[..., DurableStreamBackend],
        backend: DurableStreamBackend,
        topic: DurableStreamTopic,
        topic_name: str,
    ) -> None:
        append_all(topic, payloads(6))
        epoch = epoch_of(backend, topic_name)
        with topic.subscribe_from_beginning() as subscription:
            cursors = [r.cursor for r in drain(subscription, 6)]
        positions = [backend.admin.cursor_position(topic_name, cursor) for cursor in cursors]
        assert positions == [CursorPosition(epoch, ordinal) for ordinal in range(1, 7)]
        # Ordinals are places in the topic, not in what is retained: they go on counting after a trim.
        backend.admin.trim_topic(topic_name, keep_last=2)
        append_all(topic, [b"r6", b"r7"])
        with topic.subscribe_from_beginning() as subscription:
            later = [backend.admin.cursor_position(topic_name, r.cursor).ordinal for r in drain(subscription, 4)]
        assert later == [5, 6, 7, 8]
        if not self.store_in_process:  # another backend object on the store reads the same positions
            assert open_backend().admin.cursor_position(topic_name, cursors[2]) == CursorPosition(epoch, 3)

    def test_cursor_position_refuses_what_is_not_a_cursor(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(2))
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 1)[0].cursor
        hostile: list[object] = [*MALFORMED_CURSORS, None, 42, b"1.AAAA", cursor.encode(), *damaged_cursors(cursor)]
        for bad in hostile:
            with pytest.raises(CursorUnavailableError) as caught:
                backend.admin.cursor_position(topic_name, bad)  # type: ignore[arg-type]
            assert caught.value.reason in ("malformed", "foreign"), (bad, caught.value.reason)
        for name in BAD_NAMES:
            with pytest.raises(ValueError):
                backend.admin.cursor_position(name, cursor)  # type: ignore[arg-type]

    def test_cursor_position_refuses_another_topics_cursor(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        other_name = topic_name + "-other"
        other = backend.topic(other_name)
        append_all(topic, payloads(2))
        append_all(other, payloads(2))
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 1)[0].cursor
        built = backend.admin.cursor_after(topic_name, epoch_of(backend, topic_name), 1)
        for foreign in (cursor, built):
            with pytest.raises(CursorUnavailableError) as caught:
                backend.admin.cursor_position(other_name, foreign)
            assert caught.value.reason == "foreign"

    def test_a_recreated_topics_old_cursor_names_the_old_incarnation(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(3))
        old_epoch = epoch_of(backend, topic_name)
        with topic.subscribe_from_beginning() as subscription:
            cursor = drain(subscription, 2)[-1].cursor
        backend.admin.delete_topic(topic_name)
        new_epoch = backend.admin.create_topic(topic_name).epoch
        append_all(topic, payloads(5, "new"))
        # The position still decodes, and says which incarnation it belongs to: not this one ...
        assert backend.admin.cursor_position(topic_name, cursor) == CursorPosition(old_epoch, 2)
        assert old_epoch != new_epoch
        # ... so it, and any cursor built on the old epoch, is refused rather than resolved against new records.
        assert expect_cursor_unavailable(topic, cursor).reason == "epoch"
        for ordinal in (0, 1, 2, 3):
            assert (
                expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, old_epoch, ordinal)).reason
                == "epoch"
            )

    # cursor_after ------------------------------------------------------------------------------

    def test_cursor_after_resumes_exactly_after_each_ordinal(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        count = 12
        items = payloads(count)
        append_all(topic, items)
        epoch = epoch_of(backend, topic_name)
        with topic.subscribe_from_beginning() as subscription:
            delivered = [r.cursor for r in drain(subscription, count)]
        for ordinal in range(count + 1):
            built = backend.admin.cursor_after(topic_name, epoch, ordinal)
            assert isinstance(built, str) and built
            assert backend.admin.cursor_position(topic_name, built) == CursorPosition(epoch, ordinal)
            assert_resumes(topic, built, items[ordinal:])
            if ordinal:  # the same suffix as the cursor delivered with record ``ordinal``
                assert_resumes(topic, delivered[ordinal - 1], items[ordinal:])

    def test_cursor_after_finds_ordinals_far_into_a_long_topic(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        # A position is found wherever it lies, not only within the first read from the start.
        count = LONG_TOPIC
        items = payloads(count)
        append_all(topic, items)
        epoch = epoch_of(backend, topic_name)
        with topic.subscribe_from_beginning() as subscription:
            delivered = [r.cursor for r in drain(subscription, count)]
        for ordinal in (0, 1, 127, 128, 129, 200, count - 1, count):
            with topic.subscribe_from_cursor(backend.admin.cursor_after(topic_name, epoch, ordinal)) as resumed:
                records = drain(resumed, count - ordinal)
                assert_idle(resumed)
            assert [r.payload for r in records] == items[ordinal:]
            positions = [backend.admin.cursor_position(topic_name, r.cursor) for r in records]
            assert positions == [CursorPosition(epoch, later) for later in range(ordinal + 1, count + 1)]
        # A delivered cursor's position, built back into a cursor, resumes where the delivered one does.
        for ordinal in (129, 200, 257, count - 1):
            position = backend.admin.cursor_position(topic_name, delivered[ordinal - 1])
            assert position == CursorPosition(epoch, ordinal)
            built = backend.admin.cursor_after(topic_name, position.epoch, position.ordinal)
            for cursor in (delivered[ordinal - 1], built):
                assert_resumes(topic, cursor, items[ordinal:])

    def test_cursor_after_far_into_a_long_topic_still_refuses_trimmed_and_old_positions(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        count = LONG_TOPIC
        items = payloads(count)
        append_all(topic, items)
        old_epoch = epoch_of(backend, topic_name)
        backend.admin.trim_topic(topic_name, keep_last=100)  # ordinals 221 to 320 remain
        for ordinal in (0, 129, 200, 219):
            assert (
                expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, old_epoch, ordinal)).reason
                == "trimmed"
            )
        for ordinal in (220, 221, 300):
            assert_resumes(topic, backend.admin.cursor_after(topic_name, old_epoch, ordinal), items[ordinal:])
        # A re-created topic as long as the old one: the old incarnation's positions are not resolved
        # against the new records, however far into them they would fall.
        backend.admin.delete_topic(topic_name)
        new_epoch = backend.admin.create_topic(topic_name).epoch
        append_all(topic, payloads(count, "new"))
        for ordinal in (0, 200, 300, count):
            assert (
                expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, old_epoch, ordinal)).reason
                == "epoch"
            )
        assert_resumes(topic, backend.admin.cursor_after(topic_name, new_epoch, 200), payloads(count, "new")[200:])

    def test_cursor_after_round_trips_through_cursor_position(
        self, backend: DurableStreamBackend, topic_name: str
    ) -> None:
        epoch = backend.admin.create_topic(topic_name).epoch
        for ordinal in (0, 1, 2, 1000, 2**53 + 1, 2**64 - 1):
            built = backend.admin.cursor_after(topic_name, epoch, ordinal)
            assert backend.admin.cursor_position(topic_name, built) == CursorPosition(epoch, ordinal)
        for epoch_text in ("e", "é" * 100, "x" * 255):
            built = backend.admin.cursor_after(topic_name, epoch_text, 3)
            assert backend.admin.cursor_position(topic_name, built) == CursorPosition(epoch_text, 3)

    def test_cursor_after_the_tail_waits_then_ends_with_the_seal(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        epoch = backend.admin.create_topic(topic_name).epoch
        with topic.subscribe_from_cursor(backend.admin.cursor_after(topic_name, epoch, 0)) as empty:
            assert_idle(empty)
        append_all(topic, payloads(3))
        with topic.subscribe_from_cursor(backend.admin.cursor_after(topic_name, epoch, 3)) as at_tail:
            assert_idle(at_tail)
            topic.append(b"r3")
            assert [r.payload for r in drain(at_tail, 1)] == [b"r3"]
            topic.seal()
            assert at_tail.receive(timeout=5) is CLOSED
        with topic.subscribe_from_cursor(backend.admin.cursor_after(topic_name, epoch, 4)) as after_the_end:
            assert after_the_end.receive(timeout=5) is CLOSED

    def test_cursor_after_behind_retention_or_past_the_tail_is_refused(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        items = payloads(10)
        append_all(topic, items)
        epoch = epoch_of(backend, topic_name)
        backend.admin.trim_topic(topic_name, keep_last=3)  # ordinals 8, 9 and 10 remain
        for ordinal in (0, 1, 6):
            assert (
                expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, epoch, ordinal)).reason
                == "trimmed"
            )
        assert_resumes(topic, backend.admin.cursor_after(topic_name, epoch, 7), items[7:])
        # A position no record has had yet is no position of this topic either: the store does not hold
        # the history before it (what a store that lost its last records looks like to their readers).
        for ordinal in (11, 12, 2**63):
            assert (
                expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, epoch, ordinal)).reason
                == "history_diverged"
            )

    def test_cursor_after_of_an_epoch_that_is_not_the_topics_is_refused(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(3))
        epoch = epoch_of(backend, topic_name)
        for made_up in ("not-an-epoch", epoch + "0", epoch[:-1], epoch.upper() if epoch != epoch.upper() else "x"):
            assert (
                expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, made_up, 1)).reason == "epoch"
            )

    def test_cursor_after_is_bound_to_its_topic(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        other = backend.topic(topic_name + "-other")
        append_all(topic, payloads(3))
        append_all(other, payloads(3))
        built = backend.admin.cursor_after(topic_name, epoch_of(backend, topic_name), 1)
        assert expect_cursor_unavailable(other, built).reason == "foreign"
        assert_resumes(topic, built, [b"r1", b"r2"])

    def test_cursor_after_refuses_positions_it_cannot_express(
        self, backend: DurableStreamBackend, topic_name: str
    ) -> None:
        epoch = backend.admin.create_topic(topic_name).epoch
        for ordinal in (-1, -(2**70), 2**64, 2**100, 1.5, "3", None, True):
            with pytest.raises(ValueError):
                backend.admin.cursor_after(topic_name, epoch, ordinal)  # type: ignore[arg-type]
        for bad_epoch in ("", "x" * 256, "é" * 128, None, 7, b"epoch"):
            with pytest.raises(ValueError):
                backend.admin.cursor_after(topic_name, bad_epoch, 1)  # type: ignore[arg-type]
        for name in BAD_NAMES:
            with pytest.raises(ValueError):
                backend.admin.cursor_after(name, epoch, 1)  # type: ignore[arg-type]
