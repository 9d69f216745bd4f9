"""The streams the gateway serves: loading one (with expiry), keeping its metadata alive, deleting it.

A stream is the pair of topics of :mod:`.metadata`, or a workflow run's topic served read-only
(creating and forking are in :mod:`.creating`). The lock per path serialises this process's
read-modify-write of a stream's metadata (producer states, ``Stream-Seq``); several gateway processes
writing one stream at once can each accept a write the other would have refused (see
docs/conformance.md).

Deleting removes the data topic before the metadata: a delete that stops half-way leaves metadata
without records, which reads answer 404 and the next PUT replaces. Records are never deleted on the
strength of missing metadata (:mod:`.creating` refuses such a path with 409 instead).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from contextlib import AbstractContextManager

from api.core.durable_stream import DurableStreamBackend, TopicInfo

from .errors import gone, not_found
from .json_mode import is_json
from .metadata import MetadataStore, StreamMeta, data_topic
from .offsets import format_offset
from .reading import TopicReader

__all__ = ["KEEPALIVE_FRACTION", "TOUCH_FRACTION", "Stream", "StreamRegistry"]

#: With age retention, a stream's snapshot is rewritten on access once it is older than this fraction
#: of the age, so that retention never removes the metadata of a stream in use.
KEEPALIVE_FRACTION = 0.25
#: A TTL slides with reads and writes, recorded by a snapshot at most every this fraction of the TTL.
TOUCH_FRACTION = 0.25


@dataclasses.dataclass(slots=True)
class Stream:
    """One stream as a request sees it: its metadata and a snapshot of its data topic."""

    path: str
    topic: str
    meta: StreamMeta
    info: TopicInfo
    #: A workflow run's topic: served read-only, its records' writer envelopes cut off.
    run: bool = False

    @property
    def content_type(self) -> str:
        return self.meta.content_type

    @property
    def json(self) -> bool:
        return is_json(self.meta.content_type)

    @property
    def closed(self) -> bool:
        return self.info.sealed

    @property
    def tail(self) -> int:
        return self.info.last_ordinal

    def offset(self, ordinal: int, digest: str = "") -> str:
        """The offset after record ``ordinal``, which ``digest`` (the history up to it) names when known."""
        if not digest and ordinal == self.info.last_ordinal:
            digest = self.info.last_digest
        return format_offset(ordinal, self.info.epoch, digest)

    @property
    def tail_offset(self) -> str:
        return self.offset(self.info.last_ordinal)

    def reader(self, backend: DurableStreamBackend) -> TopicReader:
        return TopicReader(backend, self.topic, self.info.epoch, framed=self.meta.framed)


class StreamRegistry:
    def __init__(self, backend: DurableStreamBackend, *, max_age: float | None = None) -> None:
        """``max_age``: the store's age retention in seconds (``None`` when records are kept for ever)."""
        self.backend = backend
        self.metadata = MetadataStore(backend)
        self.keepalive = None if max_age is None else max_age * KEEPALIVE_FRACTION
        self._locks: weakref.WeakValueDictionary[str, _PathLock] = weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()

    def lock(self, path: str) -> AbstractContextManager[object]:
        with self._locks_guard:
            lock = self._locks.get(path)
            if lock is None:
                lock = self._locks[path] = _PathLock()
        return lock

    # Loading ------------------------------------------------------------------------------------

    def load(self, path: str, *, cached: bool = False) -> Stream:
        """The stream at ``path``; 404 when absent or expired, 410 when deleted but still forked.

        ``cached``: take this process's newest snapshot without asking the store, for a write that
        reads nothing a concurrent change could have made stale (a plain append: content type and
        expiry). The data topic's incarnation still checks it; a snapshot of a deleted, closed,
        soft-deleted (its topic is sealed) or expired stream is read again.
        """
        if cached:
            meta = self.metadata.cached(path)
            if meta is not None and not (meta.pending or meta.soft_deleted or meta.expired()):
                info = self.backend.admin.topic_info(data_topic(path))
                if info is not None and info.epoch == meta.data_epoch and not info.sealed:
                    return Stream(path, data_topic(path), meta, info)
        meta = self.metadata.load(path)
        if meta is None or meta.pending:
            raise not_found()
        if meta.expired():
            with self.lock(path):
                self.expire(path)
            meta = self.metadata.load(path)
            if meta is None or meta.pending:
                raise not_found()
        if meta.soft_deleted:
            raise gone("the stream was deleted; forks of it still read its records")
        info = self.backend.admin.topic_info(data_topic(path))
        if info is None or info.epoch != meta.data_epoch:
            # Its records are gone (age retention removed the idle topic, or a delete stopped half-way).
            raise not_found()
        return Stream(path, data_topic(path), meta, info)

    def load_run(self, path: str, topic: str, *, pending: bool = False) -> Stream:
        """A run's topic as a read-only stream; ``pending``: the run has not started its stream yet, so a
        missing topic is created (empty) for its events to come, rather than answered 404."""
        info = self.backend.admin.topic_info(topic)
        if info is None and pending:
            info = self.backend.admin.create_topic(topic)
        if info is None:
            raise not_found("the run has no events (any more)")
        meta = StreamMeta(content_type="application/json", data_epoch=info.epoch, created=0.0, touched=0.0)
        return Stream(path, topic, meta, info, run=True)

    def refresh(self, stream: Stream) -> Stream:
        info = self.backend.admin.topic_info(stream.topic)
        if info is None or info.epoch != stream.info.epoch:
            raise not_found()
        return dataclasses.replace(stream, info=info)

    # Keeping metadata current -------------------------------------------------------------------

    def touch(self, stream: Stream, *, slide: bool = True) -> None:
        """Record an access: slide a TTL (``slide``: reads and writes do, HEAD does not), keep the snapshot young.

        A snapshot is written only when one is due (a quarter TTL since the last slide, or a quarter of
        the retention age since the last snapshot), from the newest snapshot read again under the lock:
        ``stream.meta`` may be this process's cached copy.
        """
        if stream.run or not self._due(stream.meta, time.time(), slide):
            return
        with self.lock(stream.path):
            now = time.time()
            meta = self.metadata.load(stream.path)
            if meta is None or meta.pending or meta.data_epoch != stream.meta.data_epoch or meta.expired(now):
                return
            if not self._due(meta, now, slide):
                return
            if slide:
                meta.touched = now
            self.metadata.save(stream.path, meta)

    def _due(self, meta: StreamMeta, now: float, slide: bool) -> bool:
        ttl = meta.ttl_seconds
        if slide and ttl is not None and now - meta.touched >= ttl * TOUCH_FRACTION:
            return True
        return self.keepalive is not None and now - meta.saved >= self.keepalive

    # Deleting -----------------------------------------------------------------------------------

    def delete(self, path: str) -> None:
        with self.lock(path):
            meta = self.metadata.load(path)
            if meta is None or meta.pending:
                raise not_found()
            if meta.expired():
                self.expire(path)
                raise not_found()
            if meta.soft_deleted:
                raise gone("the stream was deleted; forks of it still read its records")
            if meta.forks:
                self._soft_delete(path, meta)
                return
            # Under the lock, as ``expire`` does: a PUT between the records' removal and the metadata's
            # would otherwise have its new snapshot deleted, leaving its records with no metadata (409).
            self.remove(path, meta)

    def expire(self, path: str) -> None:
        """Delete the stream at ``path`` if it has expired (soft-delete it while forks remain)."""
        meta = self.metadata.load(path)
        if meta is None or not meta.expired():
            return
        if meta.forks:
            if not meta.soft_deleted:
                self._soft_delete(path, meta)
            return
        self.remove(path, meta)

    def _soft_delete(self, path: str, meta: StreamMeta) -> None:
        # Sealed, so that a process appending from a cached snapshot (which does not know of the delete)
        # is refused by the store, and reads the snapshot again.
        self.backend.topic(data_topic(path)).seal()
        meta.soft_deleted = True
        self.metadata.save(path, meta)

    def remove(self, path: str, meta: StreamMeta) -> None:
        """Delete the stream's records, then its metadata, then its link from the stream it forks."""
        info = self.backend.admin.topic_info(data_topic(path))
        if info is not None and (info.epoch == meta.data_epoch or info.length == 0):
            self.backend.admin.delete_topic(data_topic(path))
        self.metadata.forget(path)
        if meta.forked_from is not None:
            self.unlink_fork(path, meta.forked_from)

    def unlink_fork(self, fork: str, parent: str) -> None:
        """Take ``fork`` off ``parent``'s forks; remove a soft-deleted parent whose last fork it was."""
        with self.lock(parent):
            parent_meta = self.metadata.load(parent)
            if parent_meta is None or fork not in parent_meta.forks:
                return
            parent_meta.forks = tuple(name for name in parent_meta.forks if name != fork)
            cascade = parent_meta.soft_deleted and not parent_meta.forks
            if not cascade:
                self.metadata.save(parent, parent_meta)
        if cascade:
            self.remove(parent, parent_meta)


class _PathLock:
    """A lock that lives as long as someone holds a reference (the registry keeps it weakly)."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def __enter__(self) -> object:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
