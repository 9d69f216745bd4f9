"""Seal: appends are refused afterwards, and a reader that reaches the end gets ``CLOSED``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from api.core.durable_stream import (
    CLOSED,
    DurableStreamBackend,
    DurableStreamTopic,
    DurableStreamUnavailableError,
    TopicSealedError,
)

from .base import ContractBase
from .helpers import append_all, drain, drain_until_closed, payloads, wait_until


class SealContract(ContractBase):
    #: Options for the seal-under-load test that make the adapter's connection pools smaller than
    #: the number of appenders, so that a pool is contended as well as the topic.
    contended_options: dict[str, object] = {}

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

    def test_append_to_a_sealed_topic_raises_without_printing_anything(
        self, topic: DurableStreamTopic, capfd: pytest.CaptureFixture[str]
    ) -> None:
        # An expected error is the caller's to handle. Under gevent, one raised in the hub's
        # threadpool (SQLite) would also be printed as a traceback by the hub, once per refused append.
        topic.seal()
        capfd.readouterr()
        with pytest.raises(TopicSealedError):
            topic.append(b"late")
        out, err = capfd.readouterr()
        assert "Traceback" not in err and "TopicSealedError" not in err, err
        assert not out

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

    def test_seal_is_served_in_turn_while_appenders_keep_appending(
        self, open_backend: Callable[..., DurableStreamBackend], topic_name: str
    ) -> None:
        # Writers are served in arrival order: a seal that waits behind appenders in a tight loop
        # (greenlets under gevent) gets its turn instead of watching them re-take a lock or a
        # pooled connection before it ever runs.
        backend = open_backend(**self.contended_options)
        topic = backend.topic(topic_name)
        appenders = 4
        accepted: list[list[bytes]] = [[] for _ in range(appenders)]
        ended: list[BaseException | None] = [None] * appenders
        started = [False] * appenders
        stop = threading.Event()  # only ends the appenders when the seal never comes

        def append_until_refused(index: int) -> None:
            started[index] = True
            try:
                # Bounded, so that an appender that never lets the others run cannot fill the memory.
                while not stop.is_set() and len(accepted[index]) < 200_000:
                    payload = f"{index}:{len(accepted[index])}".encode()
                    topic.append(payload)
                    accepted[index].append(payload)
            except Exception as exc:
                ended[index] = exc

        threads = [threading.Thread(target=append_until_refused, args=(index,)) for index in range(appenders)]
        sealer = threading.Thread(target=topic.seal)
        try:
            for thread in threads:
                thread.start()
            wait_until(
                lambda: all(started) and sum(map(len, accepted)) >= 10 * appenders,
                timeout=30,
                what="the appenders to be appending",
            )
            sealer.start()
            sealer.join(timeout=5.0)
            assert not sealer.is_alive(), (
                f"seal() waited 5 s while {sum(map(len, accepted))} appends were accepted ({list(map(len, accepted))})"
            )
            deadline = time.monotonic() + 10.0
            for thread in threads:
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))
            assert not any(thread.is_alive() for thread in threads), "appenders kept going after the seal"
        finally:
            stop.set()
            for thread in [*threads, sealer]:
                if thread.ident is not None:
                    thread.join(timeout=30)
        assert all(isinstance(error, TopicSealedError) for error in ended), ended
        with topic.subscribe_from_beginning() as subscription:
            stored = [r.payload for r in drain_until_closed(subscription, timeout=60)]
        assert len(stored) == sum(map(len, accepted))
        for index in range(appenders):
            assert [p for p in stored if p.startswith(f"{index}:".encode())] == accepted[index]
