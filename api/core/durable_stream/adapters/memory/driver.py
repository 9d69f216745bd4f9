"""The memory adapter's driver: one dict of topics behind one FIFO-fair lock."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable

from ..._contract import TopicSealedError
from ..._cooperative import yield_to_greenlets
from ..._digest import GENESIS, sha1_chain
from ..._driver import Appended, Batch, ChangeFeed, Position, Refused, StoredRecord, TopicHead, TopicInfo
from ..._fair import FairLock
from ..._options import Options
from .settings import MemorySettings

__all__ = ["MemoryDriver", "open_driver"]


@dataclasses.dataclass(slots=True)
class _Topic:
    epoch: str
    first: int = 1
    sealed: bool = False
    updated: float = dataclasses.field(default_factory=time.time)
    #: (created, payload, digest) of each retained record.
    records: list[tuple[float, bytes, str]] = dataclasses.field(default_factory=list)
    last_digest: str = GENESIS

    @property
    def last(self) -> int:
        return self.first + len(self.records) - 1

    def head(self) -> TopicHead:
        return TopicHead(
            epoch=self.epoch, first=self.first, last=self.last, sealed=self.sealed, last_digest=self.last_digest
        )

    def drop_prefix(self, count: int) -> int:
        count = min(count, len(self.records))
        if count > 0:
            del self.records[:count]
            self.first += count
        return max(count, 0)


class MemoryDriver:
    reread_interval = 5.0
    chain = staticmethod(sha1_chain)

    def __init__(self, settings: MemorySettings) -> None:
        self.identity = f"memory:{uuid.uuid4().hex}"
        self._max_records = settings.max_records
        self._max_age = settings.max_age_seconds
        self._topics: dict[str, _Topic] = {}
        self._lock = FairLock()

    def _get(self, name: str, create: bool) -> _Topic | None:
        topic = self._topics.get(name)
        if topic is None and create:
            topic = self._topics[name] = _Topic(epoch=uuid.uuid4().hex)
        return topic

    def append(self, topic: str, payload: bytes, expect: Position | None = None) -> Appended | Refused:
        yield_to_greenlets()
        with self._lock:
            state = self._topics.get(topic)
            if expect is not None and not _matches(state, expect):
                return Refused(None if state is None else state.head())
            state = self._get(topic, create=True)
            assert state is not None
            if state.sealed:
                raise TopicSealedError(f"topic {topic!r} is sealed")
            now = time.time()
            digest = sha1_chain(state.last_digest, payload)
            state.records.append((now, payload, digest))
            state.last_digest = digest
            state.updated = now
            ordinal = state.last
            if self._max_records is not None:
                state.drop_prefix(len(state.records) - self._max_records)
            return Appended(state.epoch, ordinal, digest)

    def seal(self, topic: str) -> None:
        yield_to_greenlets()
        with self._lock:
            state = self._get(topic, create=True)
            assert state is not None
            state.sealed = True
            state.updated = time.time()

    def head(self, topic: str, *, create: bool) -> TopicHead | None:
        with self._lock:
            state = self._get(topic, create)
            return None if state is None else state.head()

    def read(self, topic: str, after: Position, limit: int) -> Batch:
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                return Batch(head=None, records=())
            start = max(after.ordinal + 1, state.first)
            index = start - state.first
            records = [
                StoredRecord(start + offset, "", payload, digest)
                for offset, (_, payload, digest) in enumerate(state.records[index : index + limit])
            ]
            return Batch(head=state.head(), records=records)

    def topic_info(self, topic: str) -> TopicInfo | None:
        with self._lock:
            state = self._topics.get(topic)
            if state is None:
                return None
            return TopicInfo(
                topic, len(state.records), state.first, state.last, state.sealed, state.epoch, state.last_digest
            )

    def trim(self, topic: str, keep_last: int) -> int:
        with self._lock:
            state = self._topics.get(topic)
            return 0 if state is None else state.drop_prefix(len(state.records) - keep_last)

    def delete(self, topic: str) -> bool:
        with self._lock:
            return self._topics.pop(topic, None) is not None

    def enforce_retention(self) -> int:
        removed = 0
        now = time.time()
        with self._lock:
            for name, state in list(self._topics.items()):
                if self._max_records is not None:
                    removed += state.drop_prefix(len(state.records) - self._max_records)
                if self._max_age is not None:
                    cutoff = now - self._max_age
                    expired = next((i for i, (created, _, _) in enumerate(state.records) if created >= cutoff), None)
                    if expired is None:
                        expired = len(state.records)
                    removed += state.drop_prefix(expired)
                    if state.updated < cutoff:
                        removed += len(state.records)
                        del self._topics[name]
        return removed

    def open_change_feed(self, notify: Callable[[str], None]) -> ChangeFeed | None:
        return None

    def close(self) -> None:
        with self._lock:
            self._topics.clear()


def _matches(state: _Topic | None, expect: Position) -> bool:
    """Whether a conditional append's expectation is the topic's head (a missing topic is position 0)."""
    if state is None:
        return expect.ordinal == 0
    return state.last == expect.ordinal and state.last_digest == expect.digest


def open_driver(url: str, options: Options) -> MemoryDriver:
    return MemoryDriver(MemorySettings.from_options(options))
