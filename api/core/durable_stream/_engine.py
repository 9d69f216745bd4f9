"""What the subscriptions of one backend object share with it: the driver, the wake-ups, the bookkeeping.

:class:`~._backend.DurableStreamBackend` owns one :class:`Engine`; every subscription it hands out
gets the engine instead of the backend, so the subscription module needs nothing from the backend
module and the backend's own state stays private to it.

The engine also holds the backend's :class:`~._observer.DurableStreamObserver` (metrics hooks),
fixed when the backend is connected: ``observer`` is ``None`` unless the application registered one
with :func:`~._observer.set_observer` before, and every hook site checks that attribute first, so
an unobserved backend pays one attribute test per append, read or subscription, nothing more.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Protocol, TypeVar

from ._contract import CursorUnavailableError, DurableStreamError, DurableStreamUnavailableError, TopicSealedError
from ._driver import Driver
from ._notifier import Notifier
from ._observer import DurableStreamObserver, current_observer

__all__ = ["DEFAULT_BUFFER_SIZE", "Closeable", "Engine"]

T = TypeVar("T")

#: Records a subscription holds at most (one read's worth), unless ``buffer_size`` says otherwise.
DEFAULT_BUFFER_SIZE = 128


class Closeable(Protocol):
    """A subscription, as far as the engine is concerned: closed with the backend."""

    def close(self) -> None: ...


class Engine:
    """The driver, the notifier and the open subscriptions of one backend object. Thread-safe."""

    def __init__(self, driver: Driver, *, buffer_size: int = DEFAULT_BUFFER_SIZE, name: str = "unknown") -> None:
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.driver = driver
        #: The adapter's name, as the observer's ``backend`` argument.
        self.name = name
        self.observer: DurableStreamObserver | None = current_observer()
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
            closed = DurableStreamUnavailableError("the durable-stream backend is closed")
            self.observe_error(closed)
            raise closed
        try:
            return operation()
        except DurableStreamError as exc:
            self.observe_error(exc)
            raise
        except Exception as exc:  # adapters translate their errors; this only catches their bugs
            error = DurableStreamUnavailableError(f"unexpected adapter failure: {exc!r}")
            self.observe_error(error)
            raise error from exc

    def observe_error(self, error: DurableStreamError) -> None:
        """Tell the observer about an error on its way to a caller (a sealed topic is no failure)."""
        observer = self.observer
        if observer is None or isinstance(error, TopicSealedError):
            return
        with contextlib.suppress(Exception):  # an observer's bug must not change what the caller gets
            if isinstance(error, CursorUnavailableError):
                observer.cursor_unavailable(self.name, error.reason)
            elif isinstance(error, DurableStreamUnavailableError):
                observer.unavailable(self.name)

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
