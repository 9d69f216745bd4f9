"""Positions verify the history before them: a store that no longer holds it says so.

Every cursor names the record it follows by a digest chained over the topic's records
(``CursorPosition.digest``). A resume (or a live read) whose record is missing from the store or is
another record is ``CursorUnavailableError`` with reason ``history_diverged``, in every case: records
follow, the position is the store's tail, the tail is sealed exactly there, or the store ends before
it. Never a silent end, a skip, or another history's records.

Two kinds of test: cursors that name another record at a real ordinal (built with
``admin.cursor_after(..., digest=...)``), which every adapter runs, and real forks, where the store
forgets the topic's last records as a failover to a replica behind would and the topic goes on
differently; those need the adapter's test class to implement :meth:`ContractBase.lose_last_records`
and are skipped otherwise. The same forks show what a producer that outlives the failover does
(``as_producer(repair_window=...)``): it appends again what the store lost, so that every reader
continues exactly, or, beyond repair, starts a new incarnation that every reader is told about.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorPosition,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamRecord,
    DurableStreamTopic,
    RepairingProducer,
    TopicCursor,
    TopicSealedError,
)

from .base import ContractBase
from .helpers import append_all, assert_idle, drain, drain_until_closed, expect_cursor_unavailable, payloads

DIVERGED = "history_diverged"
#: A digest no record of these tests has (the chance that one does is 2**-64 per record).
OTHER_DIGEST = "0123456789abcdef"


def read_all(topic: DurableStreamTopic, count: int) -> list[DurableStreamRecord]:
    with topic.subscribe_from_beginning() as subscription:
        return drain(subscription, count)


def assert_exact_or_diverged(
    topic: DurableStreamTopic, cursor: TopicCursor, expected: list[bytes] | None, *, sealed: bool
) -> None:
    """A resume from ``cursor`` brings exactly ``expected`` (then the end or a wait), or, for ``None``,
    is refused as ``history_diverged``."""
    if expected is None:
        error = expect_cursor_unavailable(topic, cursor)
        assert error.reason == DIVERGED, f"{error.reason}: {error}"
        return
    with topic.subscribe_from_cursor(cursor) as resumed:
        if sealed:
            assert [r.payload for r in drain_until_closed(resumed)] == expected
        else:
            assert [r.payload for r in drain(resumed, len(expected))] == expected
            assert_idle(resumed)


class HistoryContract(ContractBase):
    # positions name their record ------------------------------------------------------------------

    def test_each_cursor_names_its_record_by_a_digest_of_the_history(
        self,
        open_backend: Callable[..., DurableStreamBackend],
        backend: DurableStreamBackend,
        topic: DurableStreamTopic,
        topic_name: str,
    ) -> None:
        append_all(topic, [b"same", b"same", b"other"])
        positions = [backend.admin.cursor_position(topic_name, r.cursor) for r in read_all(topic, 3)]
        digests = [position.digest for position in positions]
        assert all(len(digest) == 16 and set(digest) <= set("0123456789abcdef") for digest in digests), digests
        # The same payload twice is two records: the digest covers what came before.
        assert len(set(digests)) == 3
        info = backend.admin.topic_info(topic_name)
        assert info is not None and info.last_digest == digests[-1]
        if not self.store_in_process:  # the store computed them: another backend object reads the same
            other = open_backend()
            again = [
                other.admin.cursor_position(topic_name, r.cursor).digest for r in read_all(other.topic(topic_name), 3)
            ]
            assert again == digests
        # A built cursor with the record's digest resumes where the delivered one does.
        built = backend.admin.cursor_after(topic_name, positions[0].epoch, 1, digests[0])
        assert backend.admin.cursor_position(topic_name, built) == CursorPosition(positions[0].epoch, 1, digests[0])
        assert backend.admin.cursor_position(topic_name, built).digest == digests[0]
        assert_exact_or_diverged(topic, built, [b"same", b"other"], sealed=False)

    def test_cursor_after_refuses_a_digest_no_record_can_have(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        topic.append(b"r0")
        epoch = backend.admin.create_topic(topic_name).epoch
        for bad in ("0123", "0123456789ABCDEF", "0123456789abcdeg", "0123456789abcdef0", None, 7):
            with pytest.raises(ValueError):
                backend.admin.cursor_after(topic_name, epoch, 1, bad)  # type: ignore[arg-type]

    # another record at the position ------------------------------------------------------------------

    @pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
    def test_a_position_naming_another_record_is_refused_wherever_it_lies(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str, sealed: bool
    ) -> None:
        count = 5
        append_all(topic, payloads(count))
        if sealed:
            topic.seal()
        epoch = backend.admin.create_topic(topic_name).epoch
        # Records follow (1..4), the position is the tail (5: sealed exactly there, or open), and the
        # store ends before it (6, 9): the record it names is different or missing, never CLOSED.
        for ordinal in (1, 2, count - 1, count, count + 1, count + 4):
            cursor = backend.admin.cursor_after(topic_name, epoch, ordinal, OTHER_DIGEST)
            error = expect_cursor_unavailable(topic, cursor)
            assert error.reason == DIVERGED, (ordinal, error.reason, str(error))
        # The genuine positions still resume exactly, through built and delivered cursors alike.
        records = read_all(topic, count)
        for index, record in enumerate(records):
            position = backend.admin.cursor_position(topic_name, record.cursor)
            built = backend.admin.cursor_after(topic_name, epoch, position.ordinal, position.digest)
            for cursor in (record.cursor, built):
                assert_exact_or_diverged(topic, cursor, payloads(count)[index + 1 :], sealed=sealed)

    def test_the_error_says_what_happened_with_positions_in_order(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(3))
        epoch = backend.admin.create_topic(topic_name).epoch
        error = expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, epoch, 7, OTHER_DIGEST))
        assert error.reason == DIVERGED
        assert "4..7" in str(error) and "trimmed" not in str(error) and "retention" not in str(error), str(error)

    def test_a_position_behind_retention_is_still_trimmed_not_diverged(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(6))
        first = read_all(topic, 6)[0]
        backend.admin.trim_topic(topic_name, keep_last=3)
        error = expect_cursor_unavailable(topic, first.cursor)
        assert error.reason == "trimmed"
        assert "2..3" in str(error), str(error)

    def test_a_trim_to_empty_keeps_the_tail_verifiable(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(3))
        last = read_all(topic, 3)[-1]
        backend.admin.trim_topic(topic_name, keep_last=0)
        info = backend.admin.topic_info(topic_name)
        assert info is not None and info.last_digest == backend.admin.cursor_position(topic_name, last.cursor).digest
        with topic.subscribe_from_cursor(last.cursor) as resumed:
            assert_idle(resumed)
            topic.append(b"next")
            assert [r.payload for r in drain(resumed, 1)] == [b"next"]
        epoch = info.epoch
        error = expect_cursor_unavailable(topic, backend.admin.cursor_after(topic_name, epoch, 3, OTHER_DIGEST))
        assert error.reason == DIVERGED

    # real forks: the store forgets its last records, and the topic goes on ----------------------------

    @pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
    def test_after_a_fork_every_position_resumes_exactly_or_is_refused(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str, sealed: bool
    ) -> None:
        count = 8
        for lost, appended in itertools.product((1, 3), (0, 1, 3, 5)):
            name = f"{topic_name}-{lost}-{appended}"
            forked = backend.topic(name)
            old = payloads(count)
            append_all(forked, old)
            cursors = [r.cursor for r in read_all(forked, count)]
            self.lose_last_records(backend, name, lost)
            kept = count - lost
            new = payloads(appended, "new")
            append_all(forked, new)
            if sealed:
                forked.seal()
            history = old[:kept] + new
            for index, cursor in enumerate(cursors):
                ordinal = index + 1
                # A reader who did not hold a lost record continues exactly; one who did is told,
                # wherever the new history ends (before, at or after its position, sealed or not).
                expected = history[ordinal:] if ordinal <= kept else None
                assert_exact_or_diverged(forked, cursor, expected, sealed=sealed)

    def test_a_live_reader_across_a_fork_is_told(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        append_all(topic, payloads(4))
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 4)] == payloads(4)
            self.lose_last_records(backend, topic_name, 2)
            append_all(topic, payloads(3, "new"))
            topic.seal()
            with pytest.raises(CursorUnavailableError) as raised:
                drain_until_closed(subscription)
            assert raised.value.reason == DIVERGED, str(raised.value)
            assert subscription.receive(timeout=0) is CLOSED

    def test_the_same_records_appended_again_restore_the_same_history(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        # What a producer that outlived the failover does: it appends again what the store lost.
        items = payloads(6)
        append_all(topic, items)
        before = read_all(topic, 6)
        self.lose_last_records(backend, topic_name, 3)
        append_all(topic, items[3:])
        append_all(topic, [b"more"])
        for index, record in enumerate(before):
            assert_exact_or_diverged(topic, record.cursor, [*items[index + 1 :], b"more"], sealed=False)

    # a producer that outlives the failover repairs it ------------------------------------------------

    def test_a_repairing_producer_appends_again_what_the_store_lost(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        producer = topic.as_producer(repair_window=16)
        assert isinstance(producer, RepairingProducer)
        items = payloads(6)
        for item in items:
            producer.append(item)
        before = read_all(topic, 6)
        self.lose_last_records(backend, topic_name, 3)
        producer.append(b"more")
        assert (producer.repaired, producer.gaps) == (3, 0)
        # Every reader continues exactly, those who had received the lost records too.
        for index, record in enumerate(before):
            assert_exact_or_diverged(topic, record.cursor, [*items[index + 1 :], b"more"], sealed=False)
        info = backend.admin.topic_info(topic_name)
        assert info is not None and info.last_ordinal == 7

    def test_another_writer_after_the_producer_is_no_failover(self, topic: DurableStreamTopic) -> None:
        producer = topic.as_producer(repair_window=4)
        producer.append(b"mine")
        topic.append(b"theirs")
        producer.append(b"mine again")
        assert [r.payload for r in read_all(topic, 3)] == [b"mine", b"theirs", b"mine again"]
        assert (producer.repaired, producer.gaps) == (0, 0)  # type: ignore[attr-defined]

    @pytest.mark.parametrize("cause", ["another_writer", "window"])
    def test_a_history_beyond_repair_becomes_a_new_incarnation(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str, cause: str
    ) -> None:
        producer = topic.as_producer(repair_window=2 if cause == "window" else 16)
        for item in payloads(6):
            producer.append(item)
        old_epoch = backend.admin.create_topic(topic_name).epoch
        before = read_all(topic, 6)
        self.lose_last_records(backend, topic_name, 3)
        if cause == "another_writer":
            topic.append(b"theirs")  # where the producer's record 4 was: its records cannot go back
        producer.append(b"more")
        assert producer.gaps == 1  # type: ignore[attr-defined]
        info = backend.admin.topic_info(topic_name)
        assert info is not None and info.epoch != old_epoch
        for record in before:  # every reader of the old incarnation is told
            assert expect_cursor_unavailable(topic, record.cursor).reason == "epoch"
        assert [r.payload for r in read_all(topic, 1)] == [b"more"]

    def test_a_repairing_producer_refuses_a_sealed_topic(self, topic: DurableStreamTopic) -> None:
        producer = topic.as_producer(repair_window=4)
        producer.append(b"one")
        topic.seal()
        with pytest.raises(TopicSealedError):
            producer.append(b"two")
        assert [r.payload for r in read_all(topic, 1)] == [b"one"]

    def test_a_retried_append_whose_first_attempt_was_stored_is_stored_once(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        producer = topic.as_producer(repair_window=4)
        producer.append(b"one")
        # The acknowledgement of an append is lost (the store has it; the producer does not know):
        # what a producer sees when its connection breaks after sending. The caller retries it.
        topic.append(b"two")
        producer.append(b"two")
        producer.append(b"three")
        assert [r.payload for r in read_all(topic, 3)] == [b"one", b"two", b"three"]
        info = backend.admin.topic_info(topic_name)
        assert info is not None and info.last_ordinal == 3

    def test_a_repairing_producers_seal_repairs_first(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        producer = topic.as_producer(repair_window=8)
        assert isinstance(producer, RepairingProducer)
        items = payloads(5)
        for item in items:
            producer.append(item)
        before = read_all(topic, 5)
        self.lose_last_records(backend, topic_name, 2)
        producer.seal()  # nothing more to append: the lost records go back before the seal
        assert producer.repaired == 2
        for index, record in enumerate(before):
            assert_exact_or_diverged(topic, record.cursor, items[index + 1 :], sealed=True)
