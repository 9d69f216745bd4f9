"""Machinery the Redis variants share: error translation, topic handles and the polling subscription."""

from __future__ import annotations

import contextlib
import enum
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from .._channel import (
    BroadcastChannelUnavailableError,
    Producer,
    Subscriber,
    Subscription,
    SubscriptionClosedError,
)

if TYPE_CHECKING:
    from redis import Redis

__all__ = [
    "CONFIRM_TIMEOUT",
    "POLL_INTERVAL",
    "NoRetryLease",
    "PollingSubscription",
    "RedisTopic",
    "check_client",
    "redis_errors_translated",
    "topic_key",
]

# The longest a receiving thread waits on the socket before looking at the subscription's state
# again; it bounds how long close() from another thread takes to unblock a receive (the contract
# promises 100 ms).
POLL_INTERVAL: Final = 0.05

# How long __enter__ waits for the server to confirm a SUBSCRIBE before calling it unavailable.
CONFIRM_TIMEOUT: Final = 10.0


@contextlib.contextmanager
def redis_errors_translated(action: str) -> Iterator[None]:
    """Turn redis-py and socket errors raised inside the block into ``BroadcastChannelUnavailableError``.

    This is the only place the Redis variants translate errors, so no ``redis.exceptions`` type can
    leak through the package's API.
    """
    import redis

    try:
        yield
    except (redis.RedisError, OSError) as exc:
        raise BroadcastChannelUnavailableError(f"{action} failed: {exc}") from exc


def check_client(client: Redis) -> None:
    """Reject clients whose replies would not be the raw bytes that were published."""
    if client.get_connection_kwargs().get("decode_responses"):
        raise ValueError("the broadcast channel needs a Redis client with decode_responses=False: payloads are bytes")


def topic_key(key_prefix: str, name: str) -> str:
    """The Redis channel or key name for topic ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a topic name must be a non-empty string, not {name!r}")
    return f"{key_prefix}{name}"


class NoRetryLease:
    """Switches off redis-py's retries on a pooled connection a subscription holds, until restored.

    redis-py retries a failed read by reconnecting and, for pub/sub, silently re-subscribing. For a
    live-only channel that would hide the gap of lost messages, and with the default backoff it
    takes seconds to give up on a dead server. A subscription therefore fails on the first
    connection error instead. The original policy goes back before the connection returns to the
    caller's pool, so nobody else's commands are affected.
    """

    def __init__(self) -> None:
        self._connection: Any = None
        self._saved: Any = None

    def apply(self, connection: Any) -> None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._connection = connection
        self._saved = connection.retry
        connection.retry = Retry(NoBackoff(), 0)

    def restore(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.retry = self._saved


class _State(enum.Enum):
    NEW = "new"
    OPENING = "opening"
    OPEN = "open"
    CLOSED = "closed"


class PollingSubscription(ABC):
    """A subscription whose connection is only ever touched by the thread inside ``__enter__`` or ``receive``.

    redis-py connections must not be used by two threads at once, and closing a socket under a
    reader blocked on it is unsafe (under gevent it raises in the waiting greenlet, with real threads
    it races the reader on the file descriptor). So the reader waits in slices of at most
    ``POLL_INTERVAL`` and ``close()`` only flips the state: if nobody is reading it releases the
    connection itself, otherwise the reader notices within one slice and releases it on its way
    out. Resources are registered with :meth:`_own`, which also releases them if the subscription
    is garbage-collected without being closed.
    """

    def __init__(self, description: str) -> None:
        self._description = description
        self._state_lock = threading.Lock()
        # Serializes receive() callers so each payload goes to exactly one of them.
        self._reader_lock = threading.Lock()
        self._state = _State.NEW
        # True while a thread inside __enter__ or receive() owns the connection; guarded by _state_lock.
        self._busy = False
        self._finalizer: weakref.finalize[..., Any] | None = None

    # -- hooks for the variants -------------------------------------------------------------------

    @abstractmethod
    def _open(self) -> None:
        """Start subscribing; register resources with :meth:`_own` before any I/O that can fail."""

    def _established(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the server to confirm the subscription."""
        return True

    @abstractmethod
    def _poll(self, timeout: float) -> bytes | None:
        """Wait at most ``timeout`` (<= ``POLL_INTERVAL``) seconds for one payload."""

    def _own(self, release: Callable[..., None], *resources: object) -> None:
        """Register ``release(*resources)`` to run exactly once, at close or garbage collection.

        ``release`` must not raise and must not refer to the subscription, or the subscription
        could never be collected.
        """
        finalizer = weakref.finalize(self, release, *resources)
        # Closing sockets while the interpreter is shutting down only produces noise.
        finalizer.atexit = False
        self._finalizer = finalizer

    # -- Subscription ------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        with self._state_lock:
            if self._state is _State.CLOSED:
                raise SubscriptionClosedError(f"{self._description} is closed")
            if self._state is not _State.NEW:
                raise RuntimeError(f"{self._description} has already been entered")
            self._state = _State.OPENING
            self._busy = True
        try:
            with redis_errors_translated(f"subscribing to {self._description}"):
                self._open()
                deadline = time.monotonic() + CONFIRM_TIMEOUT
                while not self._established(POLL_INTERVAL):
                    if self._state is _State.CLOSED:
                        raise SubscriptionClosedError(f"{self._description} was closed while it was entered")
                    if time.monotonic() > deadline:
                        raise BroadcastChannelUnavailableError(f"the server did not confirm {self._description}")
        except BaseException:
            with self._state_lock:
                self._state = _State.CLOSED
                self._busy = False
            self._release_now()
            raise
        with self._state_lock:
            self._busy = False
            closed_meanwhile = self._state is _State.CLOSED
            if not closed_meanwhile:
                self._state = _State.OPEN
        if closed_meanwhile:
            self._release_now()
            raise SubscriptionClosedError(f"{self._description} was closed while it was entered")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def receive(self, timeout: float | None = 0.1) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        if not self._acquire_reader(deadline):
            return None
        try:
            with self._state_lock:
                self._check_open()
                self._busy = True
            try:
                return self._wait_for_payload(deadline)
            finally:
                with self._state_lock:
                    self._busy = False
                    release = self._state is _State.CLOSED
                if release:
                    self._release_now()
        finally:
            self._reader_lock.release()

    def close(self) -> None:
        with self._state_lock:
            if self._state is _State.CLOSED:
                return
            self._state = _State.CLOSED
            # A thread inside __enter__ or receive() owns the connection; it releases it when it leaves.
            release = not self._busy
        if release:
            self._release_now()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                payload = self.receive(timeout=None)
            except SubscriptionClosedError:
                return
            if payload is not None:
                yield payload

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._description} {self._state.value}>"

    # -- internals ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise SubscriptionClosedError(f"{self._description} is closed")
        if self._state is not _State.OPEN:
            raise RuntimeError(f"{self._description} must be entered (used as a context manager) first")

    def _acquire_reader(self, deadline: float | None) -> bool:
        # Waits in slices too, so a caller queued behind another reader also sees close() promptly.
        while True:
            with self._state_lock:
                self._check_open()
            wait = POLL_INTERVAL if deadline is None else min(POLL_INTERVAL, deadline - time.monotonic())
            if wait > 0:
                if self._reader_lock.acquire(timeout=wait):
                    return True
            elif self._reader_lock.acquire(blocking=False):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def _wait_for_payload(self, deadline: float | None) -> bytes | None:
        while True:
            if self._state is _State.CLOSED:
                raise SubscriptionClosedError(f"{self._description} is closed")
            wait = POLL_INTERVAL if deadline is None else max(0.0, min(POLL_INTERVAL, deadline - time.monotonic()))
            try:
                with redis_errors_translated(f"receiving from {self._description}"):
                    payload = self._poll(wait)
            except BroadcastChannelUnavailableError:
                # The connection is gone and will not come back on its own: a new subscription is
                # the only honest way to continue, since anything published meanwhile is lost.
                with self._state_lock:
                    self._state = _State.CLOSED
                raise
            if payload is not None:
                return payload
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _release_now(self) -> None:
        finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer()


class _ProducerView:
    """Only the publishing half of a topic, for code that must not subscribe."""

    def __init__(self, topic: RedisTopic) -> None:
        self._topic = topic

    def publish(self, payload: bytes) -> None:
        self._topic.publish(payload)

    def __repr__(self) -> str:
        return f"<producer of {self._topic!r}>"


class _SubscriberView:
    """Only the subscribing half of a topic, for code that must not publish."""

    def __init__(self, topic: RedisTopic) -> None:
        self._topic = topic

    def subscribe(self) -> Subscription:
        return self._topic.subscribe()

    def __repr__(self) -> str:
        return f"<subscriber of {self._topic!r}>"


class RedisTopic:
    """A topic handle built from a variant's publish function and subscription factory."""

    def __init__(
        self,
        description: str,
        publish: Callable[[bytes], None],
        subscribe: Callable[[], Subscription],
    ) -> None:
        self._description = description
        self._publish = publish
        self._subscribe = subscribe

    def publish(self, payload: bytes) -> None:
        # redis-py would happily encode a str or an int; a typo should fail here, not at the reader.
        if not isinstance(payload, bytes):
            raise TypeError(f"a payload must be bytes, not {type(payload).__name__}")
        self._publish(payload)

    def subscribe(self) -> Subscription:
        return self._subscribe()

    def as_producer(self) -> Producer:
        return _ProducerView(self)

    def as_subscriber(self) -> Subscriber:
        return _SubscriberView(self)

    def __repr__(self) -> str:
        return f"<topic {self._description}>"
