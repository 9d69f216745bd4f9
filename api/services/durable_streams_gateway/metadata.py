"""Stream metadata the protocol needs and the library does not keep: one JSON snapshot per change.

Each gateway stream ``P`` is two topics: ``ds:P`` holds the records (one per append, framed as
:mod:`.framing` says) and ``ds-meta:P`` a log of metadata snapshots (content type, TTL or expiry,
producer states, the last ``Stream-Seq``, who closed it, fork links); the newest snapshot is the state.
Both live in the store every gateway process shares, so the state survives a restart and every process
sees the same one. Seal state is the data topic's own (``close`` seals it); the snapshot's
``data_epoch`` ties the pair together, so a data topic re-created behind the gateway's back is not
mistaken for the old one.

Age retention (``max_age_seconds``) applies to the metadata topic like any other, so a snapshot must
never grow that old while its stream is in use: :class:`~.streams.StreamRegistry` writes a fresh one
when the newest is older than a quarter of the age (``saved`` says when it was written).

A process keeps the newest snapshot of the streams it used last (a bounded LRU), keyed by the metadata
topic's (epoch, last ordinal): a request costs one ``topic_info`` of the metadata topic while nothing
changed, and a plain append none (see ``StreamRegistry.load``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from typing import Any

from api.core.durable_stream import (
    CLOSED,
    DurableStreamBackend,
    DurableStreamError,
    DurableStreamRecord,
    DurableStreamUnavailableError,
)

from .errors import conflict

__all__ = ["DATA_PREFIX", "META_PREFIX", "MetadataStore", "StreamMeta", "data_topic", "meta_topic"]

DATA_PREFIX = "ds:"
META_PREFIX = "ds-meta:"
_READ_TIMEOUT = 5.0
#: Streams whose newest snapshot a process keeps.
CACHE_SIZE = 4096
#: Snapshots a metadata topic grows to before it is trimmed to the newest (old ones are never read).
_KEEP_SNAPSHOTS = 16


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
    #: The data topic's records are framed (:mod:`.framing`); streams created before framing are not.
    framed: bool = False
    #: The data topic's last ordinal whose tags this snapshot has applied (producer states, Stream-Seq).
    data_tail: int = 0
    #: When this snapshot was written (Unix time; 0 for snapshots written before it was recorded).
    saved: float = 0.0
    #: Written before a create's first records: until the final snapshot, the stream does not exist
    #: and its data topic is a failed create's leftover, which the next PUT may delete.
    pending: bool = False

    def to_json(self) -> bytes:
        body: dict[str, Any] = dataclasses.asdict(self)
        body["v"] = 1
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> StreamMeta:
        body = json.loads(raw)
        body.pop("v", None)
        # Fields a newer gateway added are ignored, so that a rolling deploy can read its snapshots.
        body = {key: value for key, value in body.items() if key in _FIELDS}
        producers = {key: ProducerState(**value) for key, value in body.pop("producers", {}).items()}
        closed_by = body.pop("closed_by", None)
        meta = cls(**body, producers=producers)
        meta.closed_by = None if closed_by is None else (str(closed_by[0]), int(closed_by[1]), int(closed_by[2]))
        meta.inherited_tags = tuple((int(tag), int(last)) for tag, last in meta.inherited_tags)
        meta.forks = tuple(meta.forks)
        return meta

    def copy(self) -> StreamMeta:
        """A copy a change may mutate without touching the cached snapshot.

        Every field but the producer states holds immutable values (strings, numbers, tuples), so only
        those are copied anew: every load and every plain append takes a copy, and a JSON round trip
        per request would cost more than the rest of a cached load.
        """
        producers = {key: dataclasses.replace(state) for key, state in self.producers.items()}
        return dataclasses.replace(self, producers=producers)

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


@dataclasses.dataclass(slots=True)
class _Cached:
    epoch: str
    last_ordinal: int
    length: int
    meta: StreamMeta


class MetadataStore:
    """Reads and writes metadata snapshots through the library, with a per-process cache."""

    def __init__(self, backend: DurableStreamBackend, cache_size: int = CACHE_SIZE) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, _Cached] = collections.OrderedDict()
        self._cache_size = cache_size

    def load(self, path: str) -> StreamMeta | None:
        """The newest snapshot, or ``None`` when the stream has none (absent or deleted)."""
        name = meta_topic(path)
        info = self._backend.admin.topic_info(name)
        if info is None or info.length == 0:
            self._drop(path)
            return None
        cached = self._get(path)
        if cached is not None and cached.epoch == info.epoch and cached.last_ordinal == info.last_ordinal:
            cached.length = info.length
            return cached.meta.copy()
        record = self._last_record(name, info.epoch, info.last_ordinal)
        if record is None:
            return self._reload(path)
        meta = _parse(name, record.payload)
        self._put(path, _Cached(info.epoch, info.last_ordinal, info.length, meta))
        return meta.copy()

    def cached(self, path: str) -> StreamMeta | None:
        """The newest snapshot this process has read or written, without asking the store."""
        cached = self._get(path)
        return None if cached is None else cached.meta.copy()

    def save(self, path: str, meta: StreamMeta) -> None:
        """Write ``meta`` as the newest snapshot (its ``saved`` set to now)."""
        name = meta_topic(path)
        meta.saved = time.time()
        payload = meta.to_json()
        self._backend.topic(name).append(payload)
        cached = self._get(path)
        if cached is None:
            # A stream this process has not read: one topic_info gives the cache its key.
            info = self._backend.admin.topic_info(name)
            if info is None:
                return
            epoch, last, length = info.epoch, info.last_ordinal, info.length
        else:
            # Our snapshot is the one after the newest we knew. If another process wrote one meanwhile,
            # the next load sees a different last ordinal and reads the newest again.
            epoch, last, length = cached.epoch, cached.last_ordinal + 1, cached.length + 1
        if length > _KEEP_SNAPSHOTS:
            self._backend.admin.trim_topic(name, 1)
            length = 1
        self._put(path, _Cached(epoch, last, length, StreamMeta.from_json(payload)))

    def forget(self, path: str) -> None:
        self._backend.admin.delete_topic(meta_topic(path))
        self._drop(path)

    def _get(self, path: str) -> _Cached | None:
        with self._lock:
            cached = self._cache.get(path)
            if cached is not None:
                self._cache.move_to_end(path)
            return cached

    def _put(self, path: str, cached: _Cached) -> None:
        with self._lock:
            self._cache[path] = cached
            self._cache.move_to_end(path)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _drop(self, path: str) -> None:
        with self._lock:
            self._cache.pop(path, None)

    def _last_record(self, name: str, epoch: str, last: int) -> DurableStreamRecord | None:
        """The snapshot at ``last``; ``None`` when it could not be read (trimmed, re-created, no answer)."""
        cursor = self._backend.admin.cursor_after(name, epoch, last - 1)
        try:
            with self._backend.topic(name).subscribe_from_cursor(cursor) as subscription:
                received = subscription.receive(timeout=_READ_TIMEOUT)
        except DurableStreamError:
            # Trimmed or re-created between topic_info and the read: the caller reads again.
            return None
        return None if received is None or received is CLOSED else received

    def _reload(self, path: str) -> StreamMeta | None:
        """The newest snapshot read once more, from fresh info (not cached: the info may be older)."""
        name = meta_topic(path)
        info = self._backend.admin.topic_info(name)
        if info is None or info.length == 0:
            return None
        record = self._last_record(name, info.epoch, info.last_ordinal)
        if record is None:
            # Changed again under this read too, or the store is not answering: neither is "no stream".
            raise DurableStreamUnavailableError(f"the newest metadata snapshot of {path!r} could not be read")
        return _parse(name, record.payload)


def _parse(name: str, payload: bytes) -> StreamMeta:
    """The snapshot in ``payload``; 409 for one no gateway wrote (the topic was written to by hand).

    Like records no metadata accounts for (:mod:`.creating`), it is kept for an operator rather than
    overwritten, and the stream's records are not served on the strength of a guess.
    """
    try:
        return StreamMeta.from_json(payload)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise conflict(
            f"the stream's metadata (topic {name!r}) is not a snapshot the gateway wrote; it is kept rather "
            "than replaced: delete that topic to reuse the path"
        ) from exc


_FIELDS = frozenset(field.name for field in dataclasses.fields(StreamMeta))
