"""The small storage interface each adapter implements.

The public behaviour (cursors, boundaries, gap detection, seal, bounded buffers, close) lives once
in :mod:`._subscription` and :mod:`._backend`; an adapter only has to store records with dense
ordinals and answer a handful of atomic questions about a topic. Every method here may block on
I/O and must be safe to call from several threads at once.

Every driver method raises only :class:`~._contract.DurableStreamError` subclasses: each adapter
translates its driver's exceptions in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from ._contract import DurableStreamRecord
    from ._cooperative import Wake

__all__ = [
    "Appended",
    "Batch",
    "ChangeFeed",
    "Driver",
    "Position",
    "Refused",
    "StoredRecord",
    "TopicHead",
    "TopicInfo",
]


class Position(NamedTuple):
    """A point in a topic: the ordinal of the last record before it.

    ``native`` is the backend's own position for that record (a Redis stream ID, a JetStream
    sequence) when the adapter knows it, and ``""`` when the adapter must locate the ordinal
    itself. It never leaves the library except inside an opaque cursor. (A named tuple: one is
    made for every read a subscription makes, and a tuple is the cheapest immutable value.)
    """

    ordinal: int
    native: str = ""
    #: The digest of that record (:mod:`._digest`), ``""`` when unknown: a read compares it with the
    #: store's chain and reports another history instead of continuing it.
    digest: str = ""


class Appended(NamedTuple):
    """What ``Driver.append`` stored: the incarnation it went to, the record's ordinal and its digest."""

    epoch: str
    ordinal: int
    digest: str


@dataclasses.dataclass(frozen=True, slots=True)
class TopicHead:
    """An atomic snapshot of a topic's metadata.

    ``first`` is the first retained ordinal (``last + 1`` when nothing is retained) and ``last`` is
    the last ordinal ever assigned (``0`` before the first append). ``epoch`` is random per
    incarnation of the topic. ``last_native`` is the native position of ``last`` if known, and
    ``last_digest`` the digest of the record at ``last`` (:mod:`._digest`; ``""`` before the first
    record and when unknown). A trim keeps it: it describes the history, not what is retained.
    """

    epoch: str
    first: int
    last: int
    sealed: bool
    last_native: str = ""
    last_digest: str = ""


class StoredRecord:
    """One record as a driver read it: ordinal, native position, payload and digest (``""``: unknown).

    ``delivered`` belongs to the subscription engine: a batch that several subscriptions of one
    topic share (the Redis prefetch hands the same batch to all of them) carries the public record
    built for the first one, so the others reuse its cursor instead of encoding it again. So does
    ``follows``: the predecessor digest this record was proven to follow (one hash per shared record,
    not one per subscription). Drivers never set either and must not modify a record after returning it.
    """

    __slots__ = ("delivered", "digest", "follows", "native", "ordinal", "payload")

    def __init__(self, ordinal: int, native: str, payload: bytes, digest: str = "") -> None:
        self.ordinal = ordinal
        self.native = native
        self.payload = payload
        self.digest = digest
        self.delivered: tuple[bytes, str, DurableStreamRecord] | None = None
        self.follows: str | None = None

    def __repr__(self) -> str:
        return (
            f"StoredRecord(ordinal={self.ordinal!r}, native={self.native!r}, payload={self.payload!r}, "
            f"digest={self.digest!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredRecord):
            return NotImplemented
        mine = (self.ordinal, self.native, self.payload, self.digest)
        return mine == (other.ordinal, other.native, other.payload, other.digest)

    __hash__ = None  # type: ignore[assignment]  # mutable (the cache), so not hashable


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """A conditional append found the topic's head elsewhere (``None``: no such topic); nothing was stored."""

    head: TopicHead | None


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """Records after a position together with the head they were read under (one snapshot).

    ``head`` is ``None`` when the topic does not exist (never created, deleted or expired).
    """

    head: TopicHead | None
    records: Sequence[StoredRecord]


@dataclasses.dataclass(frozen=True, slots=True)
class TopicInfo:
    """What an operator sees of a topic through ``backend.admin.topic_info()``.

    ``length`` records are retained, ordinals ``first_ordinal`` to ``last_ordinal`` (``first_ordinal``
    is ``last_ordinal + 1`` when none is). ``epoch`` is an opaque string naming this incarnation of the
    topic; a topic deleted and re-created, or lost by its store, has a different one. Compare epochs for
    equality only. ``last_digest`` names the history up to ``last_ordinal`` (a digest chained over every
    record, see ``CursorPosition.digest``; ``""`` before the first record or when unknown): two stores, or
    one store before and after a failover, with the same epoch, last ordinal and last digest hold the
    same records. Compare for equality only.
    """

    name: str
    length: int
    first_ordinal: int
    last_ordinal: int
    sealed: bool
    epoch: str
    last_digest: str = ""


class ChangeFeed(Protocol):
    """Tells the backend which topics have changed, including through other processes.

    The engine's name for the role; each adapter's implementation is called ``<Adapter>ChangeFeed``
    (``SqliteChangeFeed``, ``RedisChangeFeed``, ``PostgresChangeFeed``).

    One feed serves every subscription of a backend object. It calls the ``notify`` callback it
    was opened with (from any thread) whenever a watched topic may have changed; spurious calls
    are harmless, missed ones only delay delivery until the subscription's fallback poll.
    """

    def watch(self, topic: str) -> None: ...

    def unwatch(self, topic: str) -> None: ...

    def wait(self, wake: Wake, timeout: float) -> None:
        """Block until ``wake`` is set or ``timeout`` seconds pass (a subscription's wait); it may return
        sooner, and the subscription then looks and waits again.

        A feed may read its own connection in the caller's thread meanwhile, which saves handing
        each change from its reader to the waiting thread; most feeds just call ``wake.wait``.
        """
        ...

    def close(self) -> None: ...


class Driver(Protocol):
    #: Distinguishes this store from others when binding cursors to a topic. It must be the same
    #: for every process that opens the same store.
    identity: str
    #: Upper bound on how long a subscription waits before re-reading its topic without a wake-up
    #: (a last resort: change feeds wake subscriptions far sooner). Not the ``poll_interval`` URL
    #: option, which some adapters use for their change feed's own period.
    reread_interval: float
    #: The digest of a record from its predecessor's digest and its payload, as the store computes it
    #: in ``append`` (:mod:`._digest`). Every record a driver returns carries its digest and every head
    #: the last record's, so that positions verify the history before them.
    chain: Callable[[str, bytes], str]

    def append(self, topic: str, payload: bytes, expect: Position | None = None) -> Appended | Refused:
        """Store one record with ordinal ``last + 1`` and its digest ``chain(last digest, payload)``.

        Creates the topic if needed. With ``expect``, only if the topic's last ordinal and last digest
        are ``expect.ordinal`` and ``expect.digest`` (a missing topic matches ``Position(0)``), checked
        atomically with the append; otherwise nothing is stored and the head found is returned.

        Raises:
            TopicSealedError: The topic is sealed.
            DurableStreamUnavailableError: The store did not acknowledge the record.
        """
        ...

    def seal(self, topic: str) -> None:
        """Mark the topic sealed (creating it if needed), atomically with respect to appends."""
        ...

    def head(self, topic: str, *, create: bool) -> TopicHead | None:
        """Return the topic's head; with ``create``, first create the topic if it does not exist."""
        ...

    def read(self, topic: str, after: Position, limit: int) -> Batch:
        """Return up to ``limit`` records with ordinals greater than ``after.ordinal``, in order.

        The records and the head come from one consistent snapshot.
        """
        ...

    def topic_info(self, topic: str) -> TopicInfo | None: ...

    def trim(self, topic: str, keep_last: int) -> int:
        """Remove all but the last ``keep_last`` records; return how many were removed."""
        ...

    def delete(self, topic: str) -> bool: ...

    def enforce_retention(self) -> int:
        """Apply the configured retention options everywhere; return how many records were removed."""
        ...

    def open_change_feed(self, notify: Callable[[str], None]) -> ChangeFeed | None:
        """Start watching for changes made elsewhere, or ``None`` if every change is seen locally."""
        ...

    def close(self) -> None: ...
