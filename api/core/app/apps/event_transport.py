"""How workflow events travel from workers to API processes: the rollout flag's two sides.

``durable_stream`` (the default) keeps every run's events in a retained topic: readers start at a
fixed position, resume after any event, and end at the sealed end. ``broadcast_channel`` is the old
live-only path: readers get what is published while they listen, nothing else, and no cursors.
Workers, the lease check and the SSE endpoints use only the small interface below, so the rest of
the app does not know which one is configured.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Self

from api.core.broadcast_channel import (
    BroadcastChannel,
    BroadcastChannelUnavailableError,
    Subscription,
    SubscriptionClosedError,
    Topic,
)
from api.core.durable_stream import (
    CLOSED,
    Closed,
    DurableStreamBackend,
    DurableStreamProducer,
    DurableStreamSubscription,
    DurableStreamUnavailableError,
    TopicCursor,
    TopicInfo,
)
from api.libs.errors import EventStreamBusyError

from .event_codec import STAMP_MARK, STAMP_SIZE, unstamped


@dataclasses.dataclass(frozen=True, slots=True)
class StreamMessage:
    """A record as a reader gets it: the payload (without the envelope), its cursor, and the stored
    bytes when they had an envelope (``event_codec.stamp_of`` reads the writer's clock in them)."""

    payload: bytes
    cursor: TopicCursor | None
    stored: bytes | None = None

    @classmethod
    def of(cls, stored: bytes, cursor: TopicCursor | None) -> StreamMessage:
        """The message of a stored record: its envelope (if any) cut off with one slice."""
        if stored[:1] == STAMP_MARK:
            return cls(stored[STAMP_SIZE:], cursor, stored)
        return cls(stored, cursor)


class EventSubscription(Protocol):
    resumable: bool

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def receive(self, timeout: float) -> StreamMessage | Closed | None: ...

    def close(self) -> None: ...


class EventTopic(Protocol):
    """What a producer of run events needs: append, a producer view and seal (a no-op when live-only).

    ``as_producer(repair_window=n)``: a producer that puts the topic right after a store failover
    (``RepairingProducer``); live-only topics have nothing to repair.
    """

    def append(self, payload: bytes) -> None: ...

    def as_producer(self, *, repair_window: int = 0) -> DurableStreamProducer: ...

    def seal(self) -> None: ...


class WorkflowEventTransport(Protocol):
    resumable: bool

    def topic(self, name: str) -> EventTopic: ...

    def subscribe_live(self, name: str) -> EventSubscription:
        """A subscription fixed at the current end: everything published after this call arrives."""
        ...

    def subscribe_resume(self, name: str, cursor: TopicCursor | None) -> EventSubscription:
        """Strictly after ``cursor``, or from the beginning of what is retained."""
        ...

    def topic_info(self, name: str) -> TopicInfo | None:
        """What is retained of the topic, or ``None`` (always ``None`` when live-only)."""
        ...

    def last_payload(self, name: str) -> bytes | None:
        """The newest retained record's payload (reads the whole retained topic), or ``None``."""
        ...


class _DurableSubscription:
    resumable = True

    def __init__(self, subscription: DurableStreamSubscription) -> None:
        self._subscription = subscription

    def __enter__(self) -> Self:
        self._subscription.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._subscription.close()

    def receive(self, timeout: float) -> StreamMessage | Closed | None:
        record = self._subscription.receive(timeout)
        if record is None or record is CLOSED:
            return record
        return StreamMessage.of(record.payload, record.cursor)

    def close(self) -> None:
        self._subscription.close()


class DurableEventTransport:
    resumable = True

    def __init__(self, backend: DurableStreamBackend) -> None:
        self._backend = backend

    def topic(self, name: str) -> EventTopic:
        return self._backend.topic(name)

    def subscribe_live(self, name: str) -> EventSubscription:
        return _DurableSubscription(self._backend.topic(name).subscribe_from_tail())

    def subscribe_resume(self, name: str, cursor: TopicCursor | None) -> EventSubscription:
        topic = self._backend.topic(name)
        subscription = topic.subscribe_from_beginning() if cursor is None else topic.subscribe_from_cursor(cursor)
        return _DurableSubscription(subscription)

    def topic_info(self, name: str) -> TopicInfo | None:
        return self._backend.admin.topic_info(name)

    def last_payload(self, name: str) -> bytes | None:
        # Only a repair of a run's end asks this, so reading the retained run once is affordable.
        last = None
        with self._backend.topic(name).subscribe_from_beginning() as subscription:
            while True:
                record = subscription.receive(timeout=0)
                if record is None or record is CLOSED:
                    return last
                last = unstamped(record.payload)


class _BroadcastTopic:
    """A broadcast topic in the shape producers expect; sealing means nothing to a live channel."""

    def __init__(self, topic: Topic) -> None:
        self._topic = topic

    def append(self, payload: bytes) -> None:
        try:
            self._topic.publish(payload)
        except Exception as exc:
            raise DurableStreamUnavailableError(f"broadcast publish failed: {exc}") from exc

    def as_producer(self, *, repair_window: int = 0) -> DurableStreamProducer:
        return self

    def seal(self) -> None:
        return None


class _BroadcastSubscription:
    resumable = False

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription

    def __enter__(self) -> Self:
        try:
            self._subscription.__enter__()
        except BroadcastChannelUnavailableError as exc:
            if _pool_exhausted(exc):
                # Not a failure of the store: this process holds as many streams as its pool allows.
                raise EventStreamBusyError(
                    "this API worker serves as many event streams as it has Redis connections; try again shortly"
                ) from exc
            raise DurableStreamUnavailableError(f"broadcast channel unavailable: {exc}") from exc
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._subscription.close()

    def receive(self, timeout: float) -> StreamMessage | Closed | None:
        try:
            payload = self._subscription.receive(timeout=timeout)
        except SubscriptionClosedError:
            return CLOSED
        except BroadcastChannelUnavailableError as exc:
            raise DurableStreamUnavailableError(f"broadcast channel unavailable: {exc}") from exc
        return None if payload is None else StreamMessage.of(payload, None)

    def close(self) -> None:
        self._subscription.close()


def _pool_exhausted(error: BaseException) -> bool:
    """Whether ``error`` was caused by the Redis client's pool having no free connection.

    redis-py's blocking pool raises a plain ``ConnectionError("No connection available.")`` after
    its timeout, its default pool ``MaxConnectionsError`` at once.
    """
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import MaxConnectionsError

    cause = error.__cause__
    if isinstance(cause, MaxConnectionsError):
        return True
    return isinstance(cause, RedisConnectionError) and str(cause) == "No connection available."


class BroadcastEventTransport:
    resumable = False

    def __init__(self, channel: BroadcastChannel) -> None:
        self._channel = channel

    def topic(self, name: str) -> EventTopic:
        return _BroadcastTopic(self._channel.topic(name))

    def subscribe_live(self, name: str) -> EventSubscription:
        return _BroadcastSubscription(self._channel.topic(name).subscribe())

    def subscribe_resume(self, name: str, cursor: TopicCursor | None) -> EventSubscription:
        # Live-only: there is nothing to resume from; the client gets what happens from now on.
        return self.subscribe_live(name)

    def topic_info(self, name: str) -> TopicInfo | None:
        return None

    def last_payload(self, name: str) -> bytes | None:
        return None
