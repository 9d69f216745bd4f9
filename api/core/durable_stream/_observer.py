"""Hooks for whoever wants to watch the library work (metrics), without the library knowing who.

An application registers one :class:`DurableStreamObserver` per process with :func:`set_observer`;
every backend opened *afterwards* (``connect()``) keeps that observer for its whole life, so the
library checks a backend attribute, never a global, on its paths, and nothing at all is called when
no observer is set (the default): no clock is read, no argument is built.

The calls are made on the library's own threads and greenlets, in the middle of appends and reads:
an observer must be cheap, must not block, must not call back into the library and must not raise
(an exception it raises is swallowed, see :func:`safely`). Counting per call into plain integers and
publishing them from another thread now and then is the intended shape. ``backend`` is the adapter's
name (``memory``, ``sqlite``, ``redis``, ``postgres``, ``nats``) whatever spelling of its URL scheme
was used.
"""

from __future__ import annotations

from typing import Protocol

__all__ = [
    "APPEND_OK",
    "APPEND_SEALED",
    "APPEND_UNAVAILABLE",
    "REASON_DIVERGED",
    "REASON_EPOCH",
    "REASON_FOREIGN",
    "REASON_MALFORMED",
    "REASON_TRIMMED",
    "REASON_UNKNOWN",
    "DurableStreamObserver",
    "current_observer",
    "set_observer",
]

#: ``appended`` outcomes: stored, refused because the topic is sealed, or not acknowledged.
APPEND_OK, APPEND_SEALED, APPEND_UNAVAILABLE = "ok", "sealed", "unavailable"

#: ``CursorUnavailableError.reason`` values: retention removed the position; the topic was deleted,
#: expired or re-created (another epoch); the cursor is another topic's; the cursor is not one of ours.
REASON_TRIMMED, REASON_EPOCH, REASON_FOREIGN, REASON_MALFORMED = "trimmed", "epoch", "foreign", "malformed"
#: The store's history at the position is not the one the cursor was handed out with: the record it
#: follows is missing or different (a store that lost its last appends, a failover to a replica behind).
REASON_DIVERGED = "history_diverged"
#: An adapter's own ``CursorUnavailableError`` that says no more.
REASON_UNKNOWN = "unknown"


class DurableStreamObserver(Protocol):
    """What the library reports. Every method must return quickly and never raise."""

    def appended(self, backend: str, outcome: str, seconds: float) -> None:
        """One ``append()`` ended with ``outcome`` (``ok`` / ``sealed`` / ``unavailable``) after ``seconds``."""
        ...

    def records_read(self, backend: str, count: int) -> None:
        """A subscription read ``count`` records (possibly 0) from the store in one batch."""
        ...

    def subscription_opened(self, backend: str) -> None:
        """A subscription is being entered (every one is closed later: see :meth:`subscription_closed`)."""
        ...

    def subscription_started(self, backend: str, start: str, backlog: int) -> None:
        """An entered subscription made its first read: ``start`` is ``beginning``, ``cursor`` or ``tail``
        and ``backlog`` the retained records after its start at that moment (what it replays)."""
        ...

    def subscription_closed(self, backend: str) -> None:
        """A subscription that was being entered is closed (once per :meth:`subscription_opened`)."""
        ...

    def cursor_unavailable(self, backend: str, reason: str) -> None:
        """A ``CursorUnavailableError`` was raised to a caller, with its ``reason``."""
        ...

    def unavailable(self, backend: str) -> None:
        """A ``DurableStreamUnavailableError`` (other than a sealed topic's) was raised to a caller."""
        ...


_observer: DurableStreamObserver | None = None


def set_observer(observer: DurableStreamObserver | None) -> None:
    """Report to ``observer`` from every backend connected from now on (``None``: to nobody)."""
    global _observer
    _observer = observer


def current_observer() -> DurableStreamObserver | None:
    return _observer
