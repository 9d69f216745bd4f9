"""Counting the calls a durable-stream backend makes to its store, for tests of what a request costs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from api.core.durable_stream import DurableStreamBackend

__all__ = ["StoreCalls"]


class _CountingTopic:
    """A topic whose store calls are written down (appends, seals, subscriptions)."""

    def __init__(self, topic: Any, record: Callable[[str], None]) -> None:
        self._topic = topic
        self._record = record

    def append(self, payload: bytes) -> None:
        self._record("append")
        self._topic.append(payload)

    def seal(self) -> None:
        self._record("seal")
        self._topic.seal()

    def subscribe_from_cursor(self, cursor: Any) -> Any:
        self._record("subscribe")
        return self._topic.subscribe_from_cursor(cursor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._topic, name)


class StoreCalls:
    """Every call a backend's store answers, by name, with the thread that made it."""

    def __init__(self, backend: DurableStreamBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int]] = []
        admin = backend.admin
        for name in ("topic_info", "create_topic", "delete_topic", "trim_topic"):
            monkeypatch.setattr(admin, name, self._counted(name, getattr(admin, name)))
        topic = backend.topic
        monkeypatch.setattr(backend, "topic", lambda name: _CountingTopic(topic(name), self._record))

    def _record(self, name: str) -> None:
        self.calls.append((name, threading.get_ident()))

    def _counted(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._record(name)
            return method(*args, **kwargs)

        return counted

    def names(self, thread: int | None = None) -> list[str]:
        return [name for name, ident in self.calls if thread is None or ident == thread]
