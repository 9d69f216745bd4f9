"""What every failover test checks, whatever the store: positions handed out before a failover resume
exactly afterwards, or are refused with ``history_diverged``; never a silent end, a skip, or a record of
the other history. The store-specific modules (``test_redis_failover.py``, ``test_postgres_failover.py``)
start the primary and replica and call :func:`check_every_position`.
"""

from __future__ import annotations

import time
import uuid
from typing import Protocol

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamProducer,
    DurableStreamRecord,
    DurableStreamSubscription,
    DurableStreamUnavailableError,
    TopicCursor,
    TopicSealedError,
    connect,
)
from api.core.durable_stream.testing.helpers import drain, drain_until_closed

BEFORE = 5
DIVERGED = "history_diverged"


class Failover(Protocol):
    """A primary, a replica behind a freezable link, and the clients' address (``harness.failover``)."""

    @property
    def url(self) -> str: ...

    def wait_replicated(self, timeout: float = 30.0) -> None: ...

    def freeze_replication(self) -> None: ...

    def replica_behind(self) -> bool: ...

    def fail_over(self) -> None: ...


def append_retrying(topic: DurableStreamProducer, payload: bytes, timeout: float = 20.0) -> None:
    """Append as a producer does across a failover: an append that failed before it reached a server is
    tried again (the relay resets the old primary's connections; the pool reconnects to the new one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            topic.append(payload)
            return
        except TopicSealedError:
            raise
        except DurableStreamUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def resume(backend: DurableStreamBackend, name: str, cursor: TopicCursor, count: int, sealed: bool) -> list[bytes]:
    """What a reader resuming from ``cursor`` gets: ``count`` records (then the end when sealed, else a wait)."""
    with backend.topic(name).subscribe_from_cursor(cursor) as resumed:
        if sealed:
            return [record.payload for record in drain_until_closed(resumed, timeout=20)]
        received = [record.payload for record in drain(resumed, count, timeout=20)]
        assert resumed.receive(timeout=0.2) is None, "more than the new history"
        return received


def fork(
    pair: Failover, backend: DurableStreamBackend, name: str, lost: int
) -> tuple[list[DurableStreamRecord], DurableStreamSubscription]:
    """Append BEFORE records (replicated) and ``lost`` more (not), read them all, fail over.

    Returns the records read and the subscription that read them, still open across the failover.
    """
    topic = backend.topic(name)
    for index in range(BEFORE):
        topic.append(f"old-{index}".encode())
    pair.wait_replicated()
    pair.freeze_replication()
    for index in range(BEFORE, BEFORE + lost):
        topic.append(f"old-{index}".encode())
    assert pair.replica_behind(), "the replica must not have the last appends"
    live = topic.subscribe_from_beginning()
    live.__enter__()
    records = drain(live, BEFORE + lost)
    pair.fail_over()
    return records, live


def check_every_position(pair: Failover, lost: int, after: int, sealed: bool, **options: object) -> None:
    """Fork a topic (``lost`` appends the replica never got, then ``after`` others on it, sealed or not)
    and resume from every position handed out before: exact, or ``history_diverged``."""
    name = f"failover-{uuid.uuid4().hex}"
    with connect(pair.url, **options) as backend, connect(pair.url, **options) as reader:
        records, live = fork(pair, backend, name, lost)
        topic = backend.topic(name)
        new = [f"new-{index}".encode() for index in range(after)]
        for payload in new:
            append_retrying(topic, payload)
        if sealed:
            topic.seal()
        history = [record.payload for record in records[:BEFORE]] + new
        for index, record in enumerate(records):
            ordinal = index + 1
            if ordinal <= BEFORE:
                rest = history[ordinal:]
                assert resume(reader, name, record.cursor, len(rest), sealed) == rest, f"after record {ordinal}"
                continue
            # This reader received a record the store lost: told, whatever the new history's length.
            with pytest.raises(CursorUnavailableError) as refused:
                resume(reader, name, record.cursor, 0, sealed)
            assert refused.value.reason == DIVERGED, (ordinal, str(refused.value))
        # The reader that was live across the failover holds the lost records: its next read says so
        # (a wake-up brings it when the topic moves; an unchanged topic is found by its periodic check).
        if after or sealed:
            with pytest.raises(CursorUnavailableError) as refused:
                while (received := live.receive(timeout=20)) is not CLOSED:
                    assert received is None or received.payload not in new, "a record of the other history"
                    assert received is not None, "no word within 20 s"
            assert refused.value.reason == DIVERGED
        live.close()


def check_repair(pair: Failover, lost: int, after: int, **options: object) -> None:
    """The producer outlives the failover: it appends again what the promoted replica lacks, so every
    position handed out before (those of the lost records included) continues exactly."""
    name = f"failover-{uuid.uuid4().hex}"
    with connect(pair.url, **options) as backend, connect(pair.url, **options) as reader:
        topic = backend.topic(name)
        producer = topic.as_producer(repair_window=64)
        old = [f"old-{index}".encode() for index in range(BEFORE + lost)]
        for payload in old[:BEFORE]:
            producer.append(payload)
        pair.wait_replicated()
        pair.freeze_replication()
        for payload in old[BEFORE:]:
            producer.append(payload)
        assert pair.replica_behind(), "the replica must not have the last appends"
        with topic.subscribe_from_beginning() as subscription:
            records = drain(subscription, BEFORE + lost)
        pair.fail_over()
        new = [f"new-{index}".encode() for index in range(after)]
        for payload in new:
            append_retrying(producer, payload)
        producer.seal()  # type: ignore[attr-defined]  # repairs first: nothing may be left to append
        assert producer.repaired == lost and producer.gaps == 0  # type: ignore[attr-defined]
        history = old + new
        for index, record in enumerate(records):
            rest = history[index + 1 :]
            assert resume(reader, name, record.cursor, len(rest), True) == rest, f"after record {index + 1}"
