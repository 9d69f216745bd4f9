"""The broadcast-channel contract: protocols every variant implements, and the errors they raise.

A broadcast channel is a *live-only* fan-out: a payload published to a topic reaches the
subscriptions that are open on that topic at that moment, and nobody else. Nothing is retained for
late subscribers and nothing is replayed after a reconnect; callers that need that use the durable
stream instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Protocol, runtime_checkable

__all__ = [
    "BroadcastChannel",
    "BroadcastChannelError",
    "BroadcastChannelUnavailableError",
    "Producer",
    "Subscriber",
    "Subscription",
    "SubscriptionClosedError",
    "Topic",
]


class BroadcastChannelError(Exception):
    """Base class of every error a broadcast channel raises on purpose."""


class SubscriptionClosedError(BroadcastChannelError):
    """The subscription has been closed (by the caller or after a failure) and yields nothing more."""


class BroadcastChannelUnavailableError(BroadcastChannelError):
    """The transport behind the channel failed; the original error is chained as ``__cause__``."""


@runtime_checkable
class Subscription(Protocol):
    """A live subscription to one topic; use it as a context manager.

    A subscription is single-use: enter it once, read from it, close it (leaving the ``with`` block
    closes it). ``receive`` may be called from several threads, but calls are served one at a time,
    so each payload goes to exactly one of them; ``close`` may be called from any thread.
    """

    def __enter__(self) -> Subscription:
        """Establish the live subscription and return ``self``.

        Every payload published after ``__enter__`` returns is delivered (while the connection
        stays up); nothing published before ``__enter__`` was called is ever delivered. Blocks for
        one or two round trips to the server.

        Raises:
            BroadcastChannelUnavailableError: the server could not be reached.
            SubscriptionClosedError: the subscription was closed before or while it was entered.
            RuntimeError: the subscription has already been entered.
        """
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the subscription; never raises and never suppresses the body's exception."""
        ...

    def receive(self, timeout: float | None = 0.1) -> bytes | None:
        """Return the next payload, waiting up to ``timeout`` seconds; ``None`` if none arrived.

        Payloads published from one thread come in the order they were published; payloads from
        different threads or processes interleave as the variant says (see its capability card).
        ``timeout=None`` waits until a payload arrives or the subscription is closed; ``timeout=0``
        (or a negative one) only takes what has already arrived.

        Thread-safety: concurrent callers are served one at a time. A ``close`` from another thread
        makes a blocked call raise ``SubscriptionClosedError`` within 100 ms.

        Raises:
            SubscriptionClosedError: the subscription is closed, including when it is closed by
                another thread while this call waits.
            BroadcastChannelUnavailableError: the connection failed; the subscription is closed
                by the failure, so later calls raise ``SubscriptionClosedError``. Payloads published
                while disconnected are lost: open a new subscription to carry on.
            RuntimeError: the subscription has not been entered.
        """
        ...

    def close(self) -> None:
        """Close the subscription and release its connection.

        Idempotent, never raises, callable from any thread (including while another thread is
        blocked in ``receive``). Payloads not yet received are discarded.
        """
        ...

    def __iter__(self) -> Iterator[bytes]:
        """Yield payloads as ``receive(timeout=None)`` returns them, stopping once the subscription is closed.

        Raises:
            BroadcastChannelUnavailableError: the connection failed (the iteration ends with it).
            RuntimeError: the subscription has not been entered.
        """
        ...


@runtime_checkable
class Producer(Protocol):
    """The publishing side of one topic."""

    def publish(self, payload: bytes) -> None:
        """Deliver ``payload`` to every subscription currently open on the topic.

        Returns once the server has accepted the payload; it does not wait for subscribers. Calls
        from one thread are delivered in call order. Thread-safe.

        Raises:
            BroadcastChannelUnavailableError: the server could not be reached (after whatever retries
                the caller's Redis client is configured with); the payload may or may not have been
                delivered.
            TypeError: ``payload`` is not ``bytes``.
        """
        ...


@runtime_checkable
class Subscriber(Protocol):
    """The subscribing side of one topic."""

    def subscribe(self) -> Subscription:
        """Return a new, not yet entered, subscription; no I/O happens until it is entered. Thread-safe."""
        ...


@runtime_checkable
class Topic(Producer, Subscriber, Protocol):
    """One named topic: publish to it and subscribe to it."""

    def as_producer(self) -> Producer:
        """Return a view of this topic that can only publish. Thread-safe; no I/O."""
        ...

    def as_subscriber(self) -> Subscriber:
        """Return a view of this topic that can only subscribe. Thread-safe; no I/O."""
        ...


@runtime_checkable
class BroadcastChannel(Protocol):
    """A namespace of topics on one transport."""

    def topic(self, name: str) -> Topic:
        """Return the topic called ``name``; topics with different names never see each other's payloads.

        No I/O and thread-safe; calling it twice with one name gives two handles on the same topic.

        Raises:
            ValueError: ``name`` is empty.
        """
        ...
