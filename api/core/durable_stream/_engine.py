"""What the subscriptions of one backend object share with it: the driver, the wake-ups, the bookkeeping.

:class:`~._backend.DurableStreamBackend` owns one :class:`Engine`; every subscription it hands out
gets the engine instead of the backend, so the subscription module needs nothing from the backend
module and the backend's own state stays private to it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Protocol, TypeVar

from ._contract import DurableStreamError, DurableStreamUnavailableError
from ._driver import Driver
from ._notifier import Notifier

__all__ = ["DEFAULT_BUFFER_SIZE", "Closeable", "Engine"]

T = TypeVar("T")

#: Records a subscription holds at most (one read's worth), unless ``buffer_size`` says otherwise.
DEFAULT_BUFFER_SIZE = 128


class Closeable(Protocol):
    """A subscription, as far as the engine is concerned: closed with the backend."""

    def close(self) -> None: ...


class Engine:
    """The driver, the notifier and the open subscriptions of one backend object. Thread-safe."""

    def __init__(self, driver: Driver, *, buffer_size: int = DEFAULT_BUFFER_SIZE) -> None:
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.driver = driver
        self.buffer_size = buffer_size
        self.notifier = Notifier(driver.open_change_feed)
        self._members: weakref.WeakSet[Closeable] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def call(self, operation: Callable[[], T]) -> T:
        """Run a driver operation, refusing when closed and turning an adapter's bug into a contract error."""
        if self._closed:
            raise DurableStreamUnavailableError("the durable-stream backend is closed")
        try:
            return operation()
        except DurableStreamError:
            raise
        except Exception as exc:  # adapters translate their errors; this only catches their bugs
            raise DurableStreamUnavailableError(f"unexpected adapter failure: {exc!r}") from exc

    def attach(self, subscription: Closeable) -> None:
        """Register an entered subscription, so that closing the backend closes it."""
        with self._lock:
            if self._closed:
                raise DurableStreamUnavailableError("the durable-stream backend is closed")
            self._members.add(subscription)

    def detach(self, subscription: Closeable) -> None:
        with self._lock:
            self._members.discard(subscription)

    def close(self) -> None:
        """Close every open subscription, stop shared readers and release connections. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            members = list(self._members)
        for member in members:
            member.close()
        self.notifier.close()
        with contextlib.suppress(Exception):  # closing must not raise; the driver is discarded anyway
            self.driver.close()
