"""A producer that repairs its topic after a store failover lost its last appends.

A store with asynchronous replication (Redis and its replica, a PostgreSQL streaming replica) can
acknowledge an append and then fail over to a replica that never received it. The producer knows what
it appended. This one keeps its last ``window`` records (payload, ordinal, digest) and appends
conditionally: only if the topic's head is still its own last record (the store checks the ordinal and
digest atomically with the append, as Kafka's idempotent producer checks sequence numbers). When the
head is elsewhere:

- behind, at one of the producer's own records (the store lost the ones after it): it appends its
  missing records again, in order, each conditional on the one before, and then its new one. The
  digests are content-chained, so the repaired history is the very one readers were handed: every
  reader, whether it had received the lost records or not, continues exactly.
- ahead, with the producer's last record in place: another writer appended after it; no failover.
  The producer takes the new head and appends.
- one past it, with the very record being appended: an earlier attempt of this append stored it and
  its acknowledgement was lost (the caller retried): taken as this append, not stored twice.
- anywhere else (the store holds other records where the producer's were, or lost more than the
  window holds): nothing can put the history back. The producer makes the gap explicit: the topic is
  deleted and its records go on in a new incarnation (a new epoch), so every reader of the old one
  is refused (``CursorUnavailableError``) and a reader from the beginning finds a topic that does not
  start where the old one did, instead of a history that silently lacks records.

A producer is meant to be its topic's main writer (a workflow run's worker). Another writer's appends
after the producer's are taken as they are; another writer's appends in place of records the
producer lost are the unrepairable case above.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import TYPE_CHECKING

from ._contract import DurableStreamProducer, DurableStreamUnavailableError, TopicSealedError
from ._cursor import CursorPosition
from ._driver import Appended, Position, Refused, TopicHead
from ._observer import APPEND_OK, APPEND_SEALED, APPEND_UNAVAILABLE

if TYPE_CHECKING:
    from ._engine import Engine

__all__ = ["RepairingProducer"]

#: Refusals one append may meet (each one means the head moved: another writer, or a repair raced).
_MAX_ROUNDS = 100


class RepairingProducer(DurableStreamProducer):
    """See the module docstring. Thread-safe: appends of one producer are made one at a time.

    ``repaired`` counts the records it appended again after finding them lost; ``gaps`` the times it
    found the topic beyond repair and started a new incarnation.
    """

    def __init__(self, engine: Engine, topic: str, window: int) -> None:
        if window < 1:
            raise ValueError("a repairing producer keeps at least one record")
        self._engine = engine
        self._topic = topic
        self._window = window
        #: (ordinal, digest, payload) of this producer's last records, oldest first, all of one epoch.
        self._log: collections.deque[tuple[int, str, bytes]] = collections.deque(maxlen=window)
        self._epoch = ""
        #: The head this producer's next append expects (its own last record), or None: unconditional.
        self._expect: Position | None = None
        self._lock = threading.Lock()
        self.repaired = 0
        self.gaps = 0

    def __repr__(self) -> str:
        return f"<RepairingProducer topic={self._topic!r} window={self._window}>"

    def append(self, payload: bytes) -> None:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        data = bytes(payload)
        observer = self._engine.observer
        if observer is None:
            self._append(data)
        else:  # the same report as a plain topic's append (the app's append metrics count these too)
            outcome = APPEND_UNAVAILABLE
            started = time.perf_counter()
            try:
                self._append(data)
                outcome = APPEND_OK
            except TopicSealedError:
                outcome = APPEND_SEALED
                raise
            finally:
                with contextlib.suppress(Exception):  # an observer's bug must not change the append's outcome
                    observer.appended(self._engine.name, outcome, time.perf_counter() - started)
        self._engine.notifier.notify(self._topic)

    def _append(self, data: bytes) -> None:
        with self._lock:
            for _ in range(_MAX_ROUNDS):
                result = self._call(data, self._expect)
                if isinstance(result, Appended):
                    self._stored(result, data)
                    return
                if self._already_stored(result.head, data):
                    return
                self._repair(result.head)
            raise DurableStreamUnavailableError(
                f"topic {self._topic!r} kept moving under the producer ({_MAX_ROUNDS} refused appends)"
            )

    @property
    def position(self) -> CursorPosition | None:
        """Where this producer's last record is (epoch, ordinal and digest), ``None`` before its first."""
        expect, epoch = self._expect, self._epoch  # swapped under the lock, read here as they were
        if expect is None or not epoch:
            return None
        return CursorPosition(epoch, expect.ordinal, expect.digest)

    def repair(self) -> None:
        """Put the topic right now, without appending: what ``append`` does first when the head is not
        this producer's last record (before a seal, say, when there is nothing more to append).

        Raises:
            TopicSealedError: The topic was sealed with this producer's records lost.
            DurableStreamUnavailableError: The store failed, or the head kept moving.
        """
        engine, topic = self._engine, self._topic
        try:
            with self._lock:
                for _ in range(_MAX_ROUNDS):
                    expect = self._expect
                    if expect is None:
                        return
                    head = engine.call(lambda: engine.driver.head(topic, create=False))
                    mine = head is not None and head.epoch == self._epoch
                    if mine and head is not None and (head.last, head.last_digest) == (expect.ordinal, expect.digest):
                        return
                    self._repair(head)
                raise DurableStreamUnavailableError(f"topic {topic!r} kept moving under the producer")
        finally:
            engine.notifier.notify(topic)

    def seal(self) -> None:
        """:meth:`repair`, then seal the topic (its last record is then this producer's, or a later one)."""
        self.repair()
        engine, topic = self._engine, self._topic
        engine.call(lambda: engine.driver.seal(topic))
        engine.notifier.notify(topic)

    # -- the steps -----------------------------------------------------------------------------------

    def _call(self, data: bytes, expect: Position | None) -> Appended | Refused:
        engine, topic = self._engine, self._topic
        return engine.call(lambda: engine.driver.append(topic, data, expect))

    def _stored(self, appended: Appended, data: bytes) -> None:
        if appended.epoch != self._epoch:
            self._log.clear()  # a new incarnation: nothing before it is this producer's to repair
            self._epoch = appended.epoch
        self._log.append((appended.ordinal, appended.digest, data))
        self._expect = Position(appended.ordinal, digest=appended.digest)

    def _already_stored(self, head: TopicHead | None, data: bytes) -> bool:
        """Whether the head is ``data`` right after this producer's last record: an earlier attempt of this
        append whose acknowledgement was lost (the caller retried it) stored it. Taken as this append."""
        expect = self._expect
        if head is None or expect is None or head.epoch != self._epoch or head.last != expect.ordinal + 1:
            return False
        if self._engine.driver.chain(expect.digest, data) != head.last_digest:
            return False
        self._stored(Appended(head.epoch, head.last, head.last_digest), data)
        return True

    def _repair(self, head: TopicHead | None) -> None:
        """The head is not this producer's last record: put the topic right, or make the gap explicit."""
        expect = self._expect
        assert expect is not None  # an unconditional append is never refused
        if head is None or head.epoch != self._epoch:
            # Deleted, expired or lost entirely by the store: the next record starts a new incarnation,
            # and its epoch tells every reader of the old one.
            self._forget()
            return
        if head.sealed:
            raise TopicSealedError(f"topic {self._topic!r} is sealed")
        if head.last >= expect.ordinal and self._digest_at(expect.ordinal) == expect.digest:
            # Another writer appended after this producer's last record: no failover, go on after it.
            self._expect = Position(head.last, digest=head.last_digest)
            return
        missing = self._missing_after(head)
        if missing is None:
            self._gap()
            return
        self._expect = Position(head.last, digest=head.last_digest)
        for ordinal, digest, data in missing:
            result = self._call(data, self._expect)
            if isinstance(result, Refused):
                return  # the head moved again meanwhile: the caller's next round looks again
            if (result.ordinal, result.digest) != (ordinal, digest):
                raise DurableStreamUnavailableError(
                    f"topic {self._topic!r}: record {ordinal} appended again came back as {result.ordinal}"
                )
            self._expect = Position(result.ordinal, digest=result.digest)
            self.repaired += 1

    def _missing_after(self, head: TopicHead) -> list[tuple[int, str, bytes]] | None:
        """This producer's records after ``head``, if they follow it without a hole and ``head`` is the
        record they were appended after (their first one's digest chains on the head's); else ``None``."""
        missing = [entry for entry in self._log if entry[0] > head.last]
        if not missing or [entry[0] for entry in missing] != list(range(head.last + 1, head.last + 1 + len(missing))):
            return None  # lost more than the window holds, or another writer's records among them
        _, digest, data = missing[0]
        if self._engine.driver.chain(head.last_digest, data) != digest:
            return None  # the store holds another record at head.last than the one this producer followed
        return missing

    def _digest_at(self, ordinal: int) -> str | None:
        """The store's digest of its record ``ordinal`` (``None``: not retained or not there)."""
        if ordinal == 0:
            return ""
        engine, topic = self._engine, self._topic
        batch = engine.call(lambda: engine.driver.read(topic, Position(ordinal - 1), 1))
        if batch.records and batch.records[0].ordinal == ordinal:
            return batch.records[0].digest
        return None

    def _gap(self) -> None:
        """Beyond repair: a new incarnation, so that no reader takes the topic's history for whole."""
        engine, topic = self._engine, self._topic
        engine.call(lambda: engine.driver.delete(topic))
        engine.notifier.notify(topic)
        self.gaps += 1
        self._forget()

    def _forget(self) -> None:
        self._log.clear()
        self._epoch = ""
        self._expect = None
