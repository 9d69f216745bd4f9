"""Helpers of the contract suite, also for an adapter's own tests: draining subscriptions on a
deadline, telling whether a reader is blocked in ``receive()``, waiting for a condition."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

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

from . import probes


def wait_until[T](check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """``check()``'s first truthy answer, asked every ``interval`` seconds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (answer := check()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return answer


#: Strings that are no cursor at all.
MALFORMED_CURSORS = [
    "",
    "garbage",
    "1.",
    "1.!!!!",
    "2.AAAA",
    "1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    "x" * 5000,
    "\x00",
    "☃",
]


def damaged_cursors(cursor: str) -> list[str]:
    """``cursor`` cut short (every third length) and with each character changed in turn."""
    cut = [cursor[:length] for length in range(1, len(cursor), 3)]
    changed = [
        cursor[:index] + ("A" if cursor[index] != "A" else "B") + cursor[index + 1 :] for index in range(len(cursor))
    ]
    return cut + changed


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
    return thread.is_alive() and frame is not None and frame.f_code.co_qualname in probes.WAIT_FRAMES


def waiting_in_receive(subscription: DurableStreamSubscription, thread: threading.Thread) -> bool:
    """Whether ``thread`` (a greenlet under gevent) is blocked in ``subscription.receive()``."""
    if probes.gevent_active():
        return probes.is_waiting(subscription)
    return blocked_in_wait(thread)


def assert_idle(subscription: DurableStreamSubscription, timeout: float = 0.05) -> None:
    assert subscription.receive(timeout=timeout) is None


def expect_cursor_unavailable(topic: DurableStreamTopic, cursor: TopicCursor | str) -> CursorUnavailableError:
    """The cursor must be refused at ``subscribe_from_cursor()`` or at ``__enter__``, never accepted.

    Returns the error, whose ``reason`` a test may check.
    """
    try:
        subscription = topic.subscribe_from_cursor(cursor)  # type: ignore[arg-type]
    except CursorUnavailableError as exc:
        return exc
    with pytest.raises(CursorUnavailableError) as caught:
        subscription.__enter__()
    assert subscription.receive(timeout=0) is CLOSED
    return caught.value
