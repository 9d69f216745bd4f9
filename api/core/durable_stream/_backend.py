"""Backends, topics and producer views on top of an adapter's :class:`~._driver.Driver`."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Self

from ._contract import (
    CursorUnavailableError,
    DurableStreamProducer,
    DurableStreamSubscription,
    DurableStreamTopic,
    DurableStreamUnavailableError,
    TopicCursor,
    TopicSealedError,
)
from ._cursor import CursorCodec, CursorPosition, validate_position
from ._driver import Driver, Position, TopicHead, TopicInfo
from ._engine import DEFAULT_BUFFER_SIZE, Engine
from ._observer import APPEND_OK, APPEND_SEALED, APPEND_UNAVAILABLE, DurableStreamObserver
from ._producer import RepairingProducer
from ._subscription import START_BEGINNING, START_CURSOR, START_TAIL, Subscription

if TYPE_CHECKING:
    import types

__all__ = ["DEFAULT_BUFFER_SIZE", "DurableStreamAdmin", "DurableStreamBackend", "validate_topic_name"]

MAX_TOPIC_NAME_LENGTH = 512


def validate_topic_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("a topic name must be a non-empty string")
    if len(name) > MAX_TOPIC_NAME_LENGTH or "\0" in name:
        raise ValueError(f"a topic name must be at most {MAX_TOPIC_NAME_LENGTH} characters without NUL")
    return name


class DurableStreamBackend:
    """One connection to a durable-stream store: hands out topics and owns shared resources.

    Create it with :func:`~api.core.durable_stream.connect`. Thread-safe; one per process (or per
    store) is enough however many topics and subscriptions are in use. Closing it closes every
    subscription it handed out.
    """

    def __init__(
        self, driver: Driver, *, buffer_size: int = DEFAULT_BUFFER_SIZE, url: str = "", name: str = "unknown"
    ) -> None:
        self._engine = Engine(driver, buffer_size=buffer_size, name=name)
        self._url = url
        self.admin = DurableStreamAdmin(self)

    def __repr__(self) -> str:
        return f"<DurableStreamBackend {self._url or self._engine.driver.identity}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.close()

    def topic(self, name: str) -> DurableStreamTopic:
        """Return the topic called ``name``. Cheap: nothing is created until it is used."""
        return _Topic(self._engine, validate_topic_name(name))

    def close(self) -> None:
        """Close every open subscription, stop shared readers and release connections. Idempotent."""
        self._engine.close()

    @property
    def closed(self) -> bool:
        return self._engine.closed


class DurableStreamAdmin:
    """Operator and test operations, outside the stream contract proper."""

    def __init__(self, backend: DurableStreamBackend) -> None:
        self._engine = backend._engine

    def topic_info(self, name: str) -> TopicInfo | None:
        """Return the topic's length, first and last ordinal, seal state and epoch, or ``None`` if absent."""
        name = validate_topic_name(name)
        return self._engine.call(lambda: self._engine.driver.topic_info(name))

    def trim_topic(self, name: str, keep_last: int) -> int:
        """Remove all but the newest ``keep_last`` records of a topic; return how many were removed.

        Subscriptions positioned before the removed prefix fail with ``CursorUnavailableError``.
        """
        name = validate_topic_name(name)
        if keep_last < 0:
            raise ValueError("keep_last must not be negative")
        removed = self._engine.call(lambda: self._engine.driver.trim(name, keep_last))
        self._engine.notifier.notify(name)
        return removed

    def delete_topic(self, name: str) -> bool:
        """Delete a topic and all its records; return whether it existed.

        A topic of the same name created later is a new incarnation: old cursors do not resolve.
        """
        name = validate_topic_name(name)
        existed = self._engine.call(lambda: self._engine.driver.delete(name))
        self._engine.notifier.notify(name)
        return existed

    def enforce_retention(self) -> int:
        """Apply the configured ``max_records`` / ``max_age_seconds``; return how many records were removed."""
        return self._engine.call(self._engine.driver.enforce_retention)

    def create_topic(self, name: str) -> TopicInfo:
        """Create the topic if it does not exist (an empty, unsealed incarnation) and return its info."""
        name = validate_topic_name(name)
        head = self._engine.call(lambda: self._engine.driver.head(name, create=True))
        info = self._engine.call(lambda: self._engine.driver.topic_info(name))
        if head is None or info is None:
            raise DurableStreamUnavailableError(f"topic {name!r} could not be created")
        return info

    def cursor_position(self, name: str, cursor: TopicCursor) -> CursorPosition:
        """The incarnation (``TopicInfo.epoch``) and ordinal of the record ``cursor`` resumes after.

        For gateways that must expose ordered positions (cursors themselves are unordered): the
        ordinal of a record is its place in the topic, ``1`` for the first record ever appended.

        Raises:
            CursorUnavailableError: ``cursor`` is not a cursor of this topic (malformed or foreign).
        """
        return CursorCodec(self._engine.driver.identity, validate_topic_name(name)).position(cursor)

    def cursor_after(self, name: str, epoch: str, ordinal: int, digest: str = "") -> TopicCursor:
        """A cursor that resumes strictly after ordinal ``ordinal`` of incarnation ``epoch`` (``0``: the start).

        The inverse of :meth:`cursor_position`. The store is not consulted here: a subscription from the
        cursor raises ``CursorUnavailableError`` when the incarnation is not the topic's (``epoch``), the
        ordinal is no longer retained (``trimmed``) or was never reached. With ``digest`` (a
        ``CursorPosition.digest``), it also raises when the store's record at that ordinal is not the one
        the digest names or is missing (``history_diverged``); without it, the history before the
        position is not checked.

        Raises:
            ValueError: An invalid topic name, an ordinal that is not an integer from 0 to 2**64 - 1, an
                epoch that is not a non-empty string of at most 255 UTF-8 bytes, or a digest that is not
                ``""`` or 16 lowercase hexadecimal characters (no topic has such a position).
        """
        name = validate_topic_name(name)
        validate_position(epoch, ordinal, digest)
        return CursorCodec(self._engine.driver.identity, name).encode(epoch, ordinal, "", digest)


class _Producer(DurableStreamProducer):
    __slots__ = ("_topic",)

    def __init__(self, topic: _Topic) -> None:
        self._topic = topic

    def __repr__(self) -> str:
        return f"<DurableStreamProducer topic={self._topic.name!r}>"

    def append(self, payload: bytes) -> None:
        self._topic.append(payload)


class _Topic(DurableStreamTopic):
    __slots__ = ("_codec", "_engine", "name")

    def __init__(self, engine: Engine, name: str) -> None:
        self._engine = engine
        self.name = name
        self._codec = CursorCodec(engine.driver.identity, name)

    def __repr__(self) -> str:
        return f"<DurableStreamTopic {self.name!r}>"

    def append(self, payload: bytes) -> None:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        data = bytes(payload)
        observer = self._engine.observer
        if observer is None:
            self._engine.call(lambda: self._engine.driver.append(self.name, data))
        else:
            self._observed_append(observer, data)
        self._engine.notifier.notify(self.name)

    def _observed_append(self, observer: DurableStreamObserver, data: bytes) -> None:
        outcome = APPEND_UNAVAILABLE
        started = time.perf_counter()
        try:
            self._engine.call(lambda: self._engine.driver.append(self.name, data))
            outcome = APPEND_OK
        except TopicSealedError:
            outcome = APPEND_SEALED
            raise
        finally:
            with contextlib.suppress(Exception):  # an observer's bug must not change the append's outcome
                observer.appended(self._engine.name, outcome, time.perf_counter() - started)

    def as_producer(self, *, repair_window: int = 0) -> DurableStreamProducer:
        if repair_window:
            return RepairingProducer(self._engine, self.name, repair_window)
        return _Producer(self)

    def seal(self) -> None:
        self._engine.call(lambda: self._engine.driver.seal(self.name))
        self._engine.notifier.notify(self.name)

    def subscribe_from_beginning(self) -> DurableStreamSubscription:
        head = self._current_head()
        start = Position(head.first - 1)
        return Subscription(self._engine, self.name, self._codec, head.epoch, start, kind=START_BEGINNING)

    def subscribe_from_tail(self) -> DurableStreamSubscription:
        head = self._current_head()
        start = Position(head.last, head.last_native, head.last_digest)
        return Subscription(self._engine, self.name, self._codec, head.epoch, start, kind=START_TAIL)

    def subscribe_from_cursor(self, cursor: TopicCursor) -> DurableStreamSubscription:
        if self._engine.closed:
            raise DurableStreamUnavailableError("the durable-stream backend is closed")
        try:
            decoded = self._codec.decode(cursor)
        except CursorUnavailableError as exc:
            self._engine.observe_error(exc)
            raise
        return Subscription(self._engine, self.name, self._codec, decoded.epoch, decoded.position, kind=START_CURSOR)

    def _current_head(self) -> TopicHead:
        head = self._engine.call(lambda: self._engine.driver.head(self.name, create=True))
        if head is None:
            raise DurableStreamUnavailableError(f"topic {self.name!r} could not be created")
        return head
