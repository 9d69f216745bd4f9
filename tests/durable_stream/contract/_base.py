"""Fixtures and helpers shared by every capability of the contract suite.

An adapter's test module subclasses :class:`~tests.durable_stream.contract.DurableStreamContract`
once and implements :meth:`ContractBase.make_backend`; nothing here is collected by itself.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from api.core.durable_stream import (
    CLOSED,
    CursorUnavailableError,
    DurableStreamBackend,
    DurableStreamRecord,
    DurableStreamSubscription,
    DurableStreamTopic,
    TopicCursor,
)
from tests.durable_stream import hooks


class ContractBase:
    """The factory hooks an adapter provides, and the helpers every capability uses."""

    #: Whether the store lives inside the test process (the memory adapter): tests that measure
    #: this process's memory while records pile up in the store do not apply.
    store_in_process: ClassVar[bool] = False

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        """Open a new backend object on this adapter's store (each call a new connection)."""
        raise NotImplementedError

    def backend_url(self, **options: Any) -> str | None:
        """A URL another process can pass to ``connect()`` to reach the same store, if any."""
        return None

    @pytest.fixture
    def open_backend(self) -> Iterator[Callable[..., DurableStreamBackend]]:
        with closing_all(self.make_backend) as open_:
            yield open_

    @pytest.fixture
    def backend(self, open_backend: Callable[..., DurableStreamBackend]) -> DurableStreamBackend:
        return open_backend()

    @pytest.fixture
    def topic_name(self) -> str:
        return f"contract-{uuid.uuid4().hex}"

    @pytest.fixture
    def topic(self, backend: DurableStreamBackend, topic_name: str) -> DurableStreamTopic:
        return backend.topic(topic_name)


def payloads(count: int, prefix: str = "r") -> list[bytes]:
    return [f"{prefix}{index}".encode() for index in range(count)]


def append_all(topic: DurableStreamTopic, items: list[bytes]) -> None:
    for item in items:
        topic.append(item)


def drain(subscription: DurableStreamSubscription, count: int, *, timeout: float = 10.0) -> list[DurableStreamRecord]:
    """Receive exactly ``count`` records, failing if they do not arrive before the deadline."""
    records: list[DurableStreamRecord] = []
    deadline = time.monotonic() + timeout
    while len(records) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"received {len(records)} of {count} records before the deadline"
        result = subscription.receive(timeout=min(remaining, 1.0))
        assert result is not CLOSED, f"subscription closed after {len(records)} of {count} records"
        if result is not None:
            records.append(result)
    return records


def drain_until_closed(subscription: DurableStreamSubscription, *, timeout: float = 10.0) -> list[DurableStreamRecord]:
    """Receive records until ``CLOSED``, failing if that does not happen before the deadline."""
    records: list[DurableStreamRecord] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"not closed before the deadline after {len(records)} records"
        result = subscription.receive(timeout=min(remaining, 1.0))
        if result is CLOSED:
            return records
        if result is not None:
            records.append(result)


@contextlib.contextmanager
def closing_all(open_one: Callable[..., DurableStreamBackend]) -> Iterator[Callable[..., DurableStreamBackend]]:
    """``open_one``, remembering every backend it opens so that all are closed at the end."""
    opened: list[DurableStreamBackend] = []

    def open_(*args: Any, **options: Any) -> DurableStreamBackend:
        backend = open_one(*args, **options)
        opened.append(backend)
        return backend

    try:
        yield open_
    finally:
        for backend in opened:
            backend.close()


def blocked_in_wait(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked waiting in a subscription's ``receive()`` (plain threads, not gevent)."""
    frame = sys._current_frames().get(thread.ident or 0)
    return thread.is_alive() and frame is not None and frame.f_code.co_qualname in hooks.WAIT_FRAMES


def waiting_in_receive(subscription: DurableStreamSubscription, thread: threading.Thread) -> bool:
    """Whether ``thread`` (a greenlet under gevent) is blocked in ``subscription.receive()``."""
    if hooks.gevent_active():
        return hooks.is_waiting(subscription)
    return blocked_in_wait(thread)


def assert_idle(subscription: DurableStreamSubscription, timeout: float = 0.05) -> None:
    assert subscription.receive(timeout=timeout) is None


def expect_cursor_unavailable(topic: DurableStreamTopic, cursor: TopicCursor | str) -> None:
    """The cursor must be refused at ``subscribe_from_cursor()`` or at ``__enter__``, never accepted."""
    try:
        subscription = topic.subscribe_from_cursor(cursor)  # type: ignore[arg-type]
    except CursorUnavailableError:
        return
    with pytest.raises(CursorUnavailableError):
        subscription.__enter__()
    assert subscription.receive(timeout=0) is CLOSED
