"""Stream metadata the protocol needs and the library does not keep: one JSON snapshot per change.

Each gateway stream ``P`` is two topics: ``ds:P`` holds the records (one per append, as appended) and
``ds-meta:P`` a log of metadata snapshots (content type, TTL or expiry, producer states, the last
``Stream-Seq``, who closed it, fork links); the newest snapshot is the state. Both live in the store
every gateway process shares, so the state survives a restart and every process sees the same one.
Seal state is the data topic's own (``close`` seals it); the snapshot's ``data_epoch`` ties the pair
together, so a data topic re-created behind the gateway's back is not mistaken for the old one.

A process caches the newest snapshot by (metadata epoch, last ordinal): a request costs one
``topic_info`` of the metadata topic while nothing changed.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

from api.core.durable_stream import CLOSED, DurableStreamBackend, DurableStreamError, DurableStreamRecord

__all__ = ["DATA_PREFIX", "META_PREFIX", "MetadataStore", "StreamMeta", "data_topic", "meta_topic"]

DATA_PREFIX = "ds:"
META_PREFIX = "ds-meta:"
_READ_TIMEOUT = 5.0


def data_topic(path: str) -> str:
    return DATA_PREFIX + path


def meta_topic(path: str) -> str:
    return META_PREFIX + path


@dataclasses.dataclass(slots=True)
class ProducerState:
    epoch: int
    seq: int
    updated: float


@dataclasses.dataclass(slots=True)
class StreamMeta:
    """The newest snapshot of one stream's metadata (mutable while a change is built, then written)."""

    content_type: str
    data_epoch: str
    created: float
    touched: float
    ttl_seconds: int | None = None
    expires_at: str | None = None
    expires_at_epoch: float | None = None
    stream_seq: str | None = None
    closed_by: tuple[str, int, int] | None = None
    producers: dict[str, ProducerState] = dataclasses.field(default_factory=dict)
    #: A fork's source path, its fork point (ordinal) and sub-offset, and the incarnation tags of its
    #: ancestors with the last ordinal of each that this fork shares (offsets of theirs it accepts).
    forked_from: str | None = None
    fork_ordinal: int = 0
    fork_sub_offset: int = 0
    inherited_tags: tuple[tuple[int, int], ...] = ()
    forks: tuple[str, ...] = ()
    soft_deleted: bool = False

    def to_json(self) -> bytes:
        body: dict[str, Any] = dataclasses.asdict(self)
        body["v"] = 1
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> StreamMeta:
        body = json.loads(raw)
        body.pop("v", None)
        producers = {key: ProducerState(**value) for key, value in body.pop("producers", {}).items()}
        closed_by = body.pop("closed_by", None)
        meta = cls(**body, producers=producers)
        meta.closed_by = None if closed_by is None else (str(closed_by[0]), int(closed_by[1]), int(closed_by[2]))
        meta.inherited_tags = tuple((int(tag), int(last)) for tag, last in meta.inherited_tags)
        meta.forks = tuple(meta.forks)
        return meta

    def copy(self) -> StreamMeta:
        return StreamMeta.from_json(self.to_json())

    def expiry(self) -> float | None:
        """Unix time at which the stream expires (TTL slides with reads and writes), if it does."""
        if self.expires_at_epoch is not None:
            return self.expires_at_epoch
        if self.ttl_seconds is not None:
            return self.touched + self.ttl_seconds
        return None

    def expired(self, now: float | None = None) -> bool:
        expiry = self.expiry()
        return expiry is not None and (time.time() if now is None else now) >= expiry


class MetadataStore:
    """Reads and writes metadata snapshots through the library, with a per-process cache."""

    def __init__(self, backend: DurableStreamBackend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, int, StreamMeta]] = {}

    def load(self, path: str) -> StreamMeta | None:
        """The newest snapshot, or ``None`` when the stream has none (absent or deleted)."""
        name = meta_topic(path)
        info = self._backend.admin.topic_info(name)
        if info is None or info.length == 0:
            with self._lock:
                self._cache.pop(path, None)
            return None
        with self._lock:
            cached = self._cache.get(path)
        if cached is not None and cached[0] == info.epoch and cached[1] == info.last_ordinal:
            return cached[2].copy()
        record = self._last_record(name, info.epoch, info.last_ordinal)
        if record is None:
            return None
        meta = StreamMeta.from_json(record.payload)
        with self._lock:
            self._cache[path] = (info.epoch, info.last_ordinal, meta)
        return meta.copy()

    def save(self, path: str, meta: StreamMeta) -> None:
        self._backend.topic(meta_topic(path)).append(meta.to_json())
        # Old snapshots are never read again: keep the log short.
        info = self._backend.admin.topic_info(meta_topic(path))
        if info is not None and info.length > 16:
            self._backend.admin.trim_topic(meta_topic(path), 1)

    def forget(self, path: str) -> None:
        self._backend.admin.delete_topic(meta_topic(path))
        with self._lock:
            self._cache.pop(path, None)

    def _last_record(self, name: str, epoch: str, last: int) -> DurableStreamRecord | None:
        cursor = self._backend.admin.cursor_after(name, epoch, last - 1)
        try:
            with self._backend.topic(name).subscribe_from_cursor(cursor) as subscription:
                received = subscription.receive(timeout=_READ_TIMEOUT)
        except DurableStreamError:
            # Trimmed or re-created between topic_info and the read: the caller retries with fresh info.
            return self._retry_last(name)
        return None if received is None or received is CLOSED else received

    def _retry_last(self, name: str) -> DurableStreamRecord | None:
        info = self._backend.admin.topic_info(name)
        if info is None or info.length == 0:
            return None
        cursor = self._backend.admin.cursor_after(name, info.epoch, info.last_ordinal - 1)
        with self._backend.topic(name).subscribe_from_cursor(cursor) as subscription:
            received = subscription.receive(timeout=_READ_TIMEOUT)
        return None if received is None or received is CLOSED else received
