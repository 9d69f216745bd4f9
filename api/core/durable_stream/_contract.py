"""The durable-stream contract: the public types every adapter implements.

A *topic* is a named, ordered, retained log of opaque byte payloads. Producers append to it;
any number of independent subscriptions read it, each from a starting position fixed before the
subscription method returns. Every record handed to a subscriber carries a :data:`TopicCursor`
that can later resume a new subscription strictly after that record.

The names and semantics follow the durable-stream proposal (the target design that
``docs/design.md`` refers to) name for name; ``docs/contract.md`` lists the proposal's acceptance
criteria and the contract tests that check each one. Nothing in this module knows about a
particular backend.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from abc import abstractmethod
from contextlib import AbstractContextManager
from typing import NewType, Protocol, Self, override

__all__ = [
    "CLOSED",
    "Closed",
    "CursorUnavailableError",
    "DurableStreamError",
    "DurableStreamProducer",
    "DurableStreamRecord",
    "DurableStreamSubscription",
    "DurableStreamTopic",
    "DurableStreamUnavailableError",
    "TopicCursor",
    "TopicSealedError",
]

#: An opaque, versioned continuation token produced by one topic. It may be persisted or sent
#: elsewhere and later handed back unchanged to the topic that produced it. Callers must not parse,
#: modify, order, construct, or compare cursors, nor use one with another topic.
TopicCursor = NewType("TopicCursor", str)


class Closed(enum.Enum):
    """The terminal receive state of a closed subscription."""

    CLOSED = enum.auto()


#: Returned by :meth:`DurableStreamSubscription.receive` once the subscription is permanently closed:
#: after :meth:`~DurableStreamSubscription.close`, after a terminal error, or after the last record
#: of a sealed topic has been returned.
CLOSED = Closed.CLOSED


class DurableStreamError(Exception):
    """Base class for every error the durable-stream abstraction raises."""


class CursorUnavailableError(DurableStreamError):
    """A requested or current resume position cannot be resolved.

    Raised for malformed or truncated cursors, cursors of another topic or of an earlier
    incarnation of this topic, positions that retention has removed, and positions whose history
    the store no longer holds. The adapter never falls back to the beginning or the tail instead.

    ``reason`` says which, where the library knows: ``trimmed`` (retention removed the position),
    ``epoch`` (the topic was deleted, expired or re-created), ``history_diverged`` (the record the
    position follows is missing from the store or is another record: a store failover lost records
    the reader had received, and the topic went on differently), ``foreign`` (another topic's cursor),
    ``malformed``; else ``unknown``.
    """

    def __init__(self, *args: object, reason: str = "unknown") -> None:
        super().__init__(*args)
        self.reason = reason


class DurableStreamUnavailableError(DurableStreamError):
    """The operation could not complete according to the stream contract.

    Raised when the backend is unreachable or answers in a way the adapter cannot reconcile with
    the contract. When :meth:`DurableStreamProducer.append` raises it, the record may or may not
    have been stored: retrying may append a duplicate.
    """


class TopicSealedError(DurableStreamUnavailableError):
    """``append()`` was refused because the topic is sealed.

    Unlike its parent, this error is certain: nothing was appended.
    """


@dataclasses.dataclass(slots=True, frozen=True)
class DurableStreamRecord:
    """One record returned to a subscriber, with the cursor that resumes strictly after it."""

    payload: bytes
    cursor: TopicCursor


class DurableStreamSubscription(AbstractContextManager["DurableStreamSubscription"], Protocol):
    """An independently positioned subscription to one topic.

    The starting boundary is fixed by the ``subscribe_*`` method that created the subscription.
    A subscription is one-shot: it is entered at most once, and once closed it stays closed.
    Apart from :meth:`close`, which may be called from any thread or greenlet, one subscription
    does not support concurrent calls.
    """

    @override
    @abstractmethod
    def __enter__(self) -> Self:
        """Start delivery from the boundary fixed when the subscription was created.

        The boundary is never recalculated, replaced or advanced here. Records appended after it
        was fixed, including those appended before this call, are delivered.

        Raises:
            CursorUnavailableError: The boundary is malformed, belongs to another topic or to an
                earlier incarnation of this one, or is no longer retained.
            DurableStreamUnavailableError: Delivery cannot be established, or the subscription was
                already entered or closed.
        """
        ...

    @override
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> bool | None:
        self.close()
        return None

    @abstractmethod
    def close(self) -> None:
        """Close the subscription and release its resources.

        Idempotent, returns ``None`` and never raises. May be called from another thread or
        greenlet; a ``receive()`` blocked at that moment returns :data:`CLOSED`, as do all later
        calls.
        """
        ...

    @abstractmethod
    def receive(self, timeout: float = 0.1) -> DurableStreamRecord | Closed | None:
        """Return the next record in topic order.

        Blocks for at most ``timeout`` seconds. Returns ``None`` when the timeout expires,
        :data:`CLOSED` when the subscription is permanently closed (including after the last
        record of a sealed topic has been returned).

        Raises:
            CursorUnavailableError: Retention removed records the subscription had not returned
                yet, or the topic was deleted or re-created. The subscription is closed.
            DurableStreamUnavailableError: Delivery cannot continue without violating the
                contract (for example the backend is unreachable), or the subscription was never
                entered. The subscription is closed.
        """
        ...


class DurableStreamProducer(Protocol):
    """A write-only view bound to one topic. Thread-safe; concurrent calls are allowed."""

    @abstractmethod
    def append(self, payload: bytes) -> None:
        """Append ``payload`` and return once the backend has acknowledged it.

        The order the topic assigns is authoritative; neither call-entry nor return order of
        concurrent calls is guaranteed.

        Raises:
            TopicSealedError: The topic is sealed; nothing was appended.
            DurableStreamUnavailableError: The backend did not acknowledge the append. The record
                may have been stored anyway.
        """
        ...


class DurableStreamTopic(DurableStreamProducer, Protocol):
    """A named, ordered durable stream with independent subscriptions. Thread-safe."""

    @abstractmethod
    def as_producer(self, *, repair_window: int = 0) -> DurableStreamProducer:
        """Return a write-only view of this topic.

        With ``repair_window`` (a number of records), the producer keeps its last records and appends
        each one only if the topic's head is still its own previous record: after a store failover that
        lost its last appends it appends them again, in order, before the new one (readers continue
        exactly), and where the topic cannot be repaired it starts a new incarnation, so that every
        reader is told instead of reading a history with a hole. Such a producer is meant to be the
        topic's main writer; see ``RepairingProducer``.
        """
        ...

    @abstractmethod
    def subscribe_from_beginning(self) -> DurableStreamSubscription:
        """Create a subscription starting at (and including) the earliest retained record.

        The earliest retained position is resolved before this method returns.

        Raises:
            DurableStreamUnavailableError: The position cannot be resolved.
        """
        ...

    @abstractmethod
    def subscribe_from_cursor(self, cursor: TopicCursor) -> DurableStreamSubscription:
        """Create a subscription starting strictly after ``cursor``.

        Raises:
            CursorUnavailableError: The cursor cannot be resolved by this topic.
            DurableStreamUnavailableError: The subscription cannot be established.
        """
        ...

    @abstractmethod
    def subscribe_from_tail(self) -> DurableStreamSubscription:
        """Create a subscription starting after the tail as of this call.

        The tail is resolved before this method returns, so every record appended afterwards is
        delivered once the subscription is entered.

        Raises:
            DurableStreamUnavailableError: The tail cannot be resolved.
        """
        ...

    @abstractmethod
    def seal(self) -> None:
        """Irreversibly prevent further appends. Idempotent.

        Sealing finalises the record sequence: a subscription that has returned the last record
        of a sealed topic returns :data:`CLOSED`.

        Raises:
            DurableStreamUnavailableError: The backend did not acknowledge the seal.
        """
        ...
