"""The streams the gateway serves: loading one (with expiry), creating, deleting and forking.

A stream is the pair of topics of :mod:`.metadata`, or a workflow run's topic served read-only. The
lock per path serialises this process's read-modify-write of a stream's metadata (producer states,
``Stream-Seq``); several gateway processes writing one stream at once can each accept a write the
other would have refused (see docs/conformance.md).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from contextlib import AbstractContextManager

from api.core.durable_stream import DurableStreamBackend, TopicInfo

from .errors import GatewayError, bad_request, conflict, gone, not_found
from .json_mode import fragment_of, is_json, media_type, values_of
from .metadata import MetadataStore, StreamMeta, data_topic
from .offsets import epoch_tag, format_offset
from .reading import TopicReader

__all__ = ["CreateRequest", "Stream", "StreamRegistry"]

DEFAULT_CONTENT_TYPE = "application/octet-stream"
_COPY_TIMEOUT = 30.0


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

    def offset(self, ordinal: int) -> str:
        return format_offset(ordinal, self.info.epoch)

    @property
    def tail_offset(self) -> str:
        return self.offset(self.info.last_ordinal)

    def reader(self, backend: DurableStreamBackend) -> TopicReader:
        return TopicReader(backend, self.topic, self.info.epoch)


@dataclasses.dataclass(frozen=True, slots=True)
class CreateRequest:
    content_type: str | None
    ttl_seconds: int | None
    expires_at: str | None
    expires_at_epoch: float | None
    closed: bool
    body: bytes
    forked_from: str | None = None
    fork_offset: tuple[int, int] | None = None  # (ordinal, tag) as parsed
    fork_sub_offset: int | None = None


class StreamRegistry:
    def __init__(self, backend: DurableStreamBackend) -> None:
        self.backend = backend
        self.metadata = MetadataStore(backend)
        self._locks: weakref.WeakValueDictionary[str, _PathLock] = weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()

    def lock(self, path: str) -> AbstractContextManager[object]:
        with self._locks_guard:
            lock = self._locks.get(path)
            if lock is None:
                lock = self._locks[path] = _PathLock()
        return lock

    # Loading ------------------------------------------------------------------------------------

    def load(self, path: str) -> Stream:
        """The stream at ``path``; 404 when absent or expired, 410 when deleted but still forked."""
        meta = self.metadata.load(path)
        if meta is None:
            raise not_found()
        if meta.expired():
            with self.lock(path):
                self._expire(path)
            meta = self.metadata.load(path)
            if meta is None:
                raise not_found()
        if meta.soft_deleted:
            raise gone("the stream was deleted; forks of it still read its records")
        info = self.backend.admin.topic_info(data_topic(path))
        if info is None or info.epoch != meta.data_epoch:
            raise not_found()
        return Stream(path, data_topic(path), meta, info)

    def load_run(self, path: str, topic: str) -> Stream:
        info = self.backend.admin.topic_info(topic)
        if info is None:
            raise not_found("the run has no events (yet, or any more)")
        meta = StreamMeta(content_type="application/json", data_epoch=info.epoch, created=0.0, touched=0.0)
        return Stream(path, topic, meta, info, run=True)

    def refresh(self, stream: Stream) -> Stream:
        info = self.backend.admin.topic_info(stream.topic)
        if info is None or info.epoch != stream.info.epoch:
            raise not_found()
        return dataclasses.replace(stream, info=info)

    def touch(self, stream: Stream) -> None:
        """Slide a TTL stream's expiry (reads and writes do): a snapshot at most every quarter TTL."""
        ttl = stream.meta.ttl_seconds
        if stream.run or ttl is None or time.time() - stream.meta.touched < ttl / 4:
            return
        with self.lock(stream.path):
            meta = self.metadata.load(stream.path)
            if meta is None or meta.data_epoch != stream.meta.data_epoch or meta.expired():
                return
            meta.touched = time.time()
            self.metadata.save(stream.path, meta)

    # Creating -----------------------------------------------------------------------------------

    def create(self, path: str, request: CreateRequest) -> tuple[bool, Stream]:
        """Create the stream (``True``) or confirm an identical one (``False``); 409 for a different one."""
        with self.lock(path):
            existing = self.metadata.load(path)
            if existing is not None and existing.expired():
                self._expire(path)
                existing = self.metadata.load(path)
            if existing is not None:
                return False, self._confirm(path, existing, request)
            if request.forked_from is not None:
                return True, self._create_fork(path, request)
            return True, self._create_plain(path, request)

    def _confirm(self, path: str, existing: StreamMeta, request: CreateRequest) -> Stream:
        if existing.soft_deleted:
            raise conflict("the stream was deleted but forks of it remain: the path cannot be reused yet")
        stream = self.load(path)
        requested_type = request.content_type or (None if request.forked_from else DEFAULT_CONTENT_TYPE)
        same = (
            (requested_type is None or media_type(requested_type) == media_type(existing.content_type))
            and (request.forked_from is not None or request.ttl_seconds == existing.ttl_seconds)
            and (request.forked_from is not None or request.expires_at == existing.expires_at)
            and request.closed == stream.closed
            and request.forked_from == existing.forked_from
            and (request.fork_offset is None or request.fork_offset[0] == existing.fork_ordinal)
            and (request.fork_sub_offset or 0) == existing.fork_sub_offset
        )
        if not same:
            raise conflict("the stream already exists with a different configuration")
        return stream

    def _fresh_topic(self, path: str) -> TopicInfo:
        info = self.backend.admin.create_topic(data_topic(path))
        if info.last_ordinal > 0 or info.sealed:
            # Records without metadata: a delete that stopped half-way. Start a new incarnation.
            self.backend.admin.delete_topic(data_topic(path))
            info = self.backend.admin.create_topic(data_topic(path))
        return info

    def _create_plain(self, path: str, request: CreateRequest) -> Stream:
        content_type = request.content_type or DEFAULT_CONTENT_TYPE
        initial = self._initial_record(content_type, request.body)
        info = self._fresh_topic(path)
        now = time.time()
        meta = StreamMeta(
            content_type=content_type,
            data_epoch=info.epoch,
            created=now,
            touched=now,
            ttl_seconds=request.ttl_seconds,
            expires_at=request.expires_at,
            expires_at_epoch=request.expires_at_epoch,
        )
        return self._finish_create(path, meta, [initial] if initial else [], request.closed)

    def _initial_record(self, content_type: str, body: bytes) -> bytes:
        if not body:
            return b""
        return fragment_of(body, allow_empty=True) if is_json(content_type) else body

    def _finish_create(self, path: str, meta: StreamMeta, records: list[bytes], closed: bool) -> Stream:
        topic = self.backend.topic(data_topic(path))
        for record in records:
            topic.append(record)
        if closed:
            topic.seal()
        # The snapshot last: until it exists the stream does not, so a crash leaves no half stream.
        self.metadata.save(path, meta)
        return self.load(path)

    def _create_fork(self, path: str, request: CreateRequest) -> Stream:
        assert request.forked_from is not None
        source_path = request.forked_from
        source_meta = self.metadata.load(source_path)
        if source_meta is None or source_meta.expired():
            raise GatewayError(404, "the fork's source stream does not exist")
        if source_meta.soft_deleted:
            raise conflict("the fork's source stream was deleted")
        if request.content_type and media_type(request.content_type) != media_type(source_meta.content_type):
            raise conflict("a fork's content type must be its source's")
        source = self.load(source_path)
        fork_ordinal = self._fork_point(source, request)
        reader = source.reader(self.backend)
        records = [record.payload for record in reader.read(0, fork_ordinal, 1 << 62, _COPY_TIMEOUT)]
        if len(records) != fork_ordinal:
            raise gone("the fork point is no longer retained by the source")
        sub = request.fork_sub_offset or 0
        if sub > 0:
            records.append(self._sub_offset_prefix(source, reader, fork_ordinal, sub))
        if request.body:
            initial = self._initial_record(source.content_type, request.body)
            if initial:
                records.append(initial)
        info = self._fresh_topic(path)
        now = time.time()
        ttl, expires_at, expires_epoch = request.ttl_seconds, request.expires_at, request.expires_at_epoch
        if ttl is None and expires_at is None:
            ttl, expires_at, expires_epoch = (
                source_meta.ttl_seconds,
                source_meta.expires_at,
                source_meta.expires_at_epoch,
            )
        inherited = tuple((tag, min(last, fork_ordinal)) for tag, last in source_meta.inherited_tags)
        tags = ((epoch_tag(source.info.epoch), fork_ordinal), *inherited)
        meta = StreamMeta(
            content_type=source_meta.content_type,
            data_epoch=info.epoch,
            created=now,
            touched=now,
            ttl_seconds=ttl,
            expires_at=expires_at,
            expires_at_epoch=expires_epoch,
            forked_from=source_path,
            fork_ordinal=fork_ordinal,
            fork_sub_offset=sub,
            inherited_tags=tags,
        )
        with self.lock(source_path):
            latest = self.metadata.load(source_path)
            if latest is None or latest.soft_deleted:
                raise conflict("the fork's source stream was deleted")
            latest.forks = (*latest.forks, path)
            self.metadata.save(source_path, latest)
        return self._finish_create(path, meta, records, request.closed)

    def _fork_point(self, source: Stream, request: CreateRequest) -> int:
        if request.fork_offset is None:
            if request.fork_sub_offset:
                raise bad_request("Stream-Fork-Sub-Offset needs Stream-Fork-Offset")
            return source.tail
        ordinal, tag = request.fork_offset
        known = tag == 0 or tag == epoch_tag(source.info.epoch)
        known = known or any(tag == t and ordinal <= last for t, last in source.meta.inherited_tags)
        if not known:
            raise bad_request("Stream-Fork-Offset is not an offset of the source stream")
        if ordinal > source.tail:
            raise bad_request("Stream-Fork-Offset is beyond the source stream's tail")
        return ordinal

    def _sub_offset_prefix(self, source: Stream, reader: TopicReader, ordinal: int, sub: int) -> bytes:
        if ordinal >= source.tail:
            raise bad_request("Stream-Fork-Sub-Offset needs a record after the fork offset")
        following = reader.read(ordinal, ordinal + 1, 1, _COPY_TIMEOUT)
        if not following:
            raise bad_request("Stream-Fork-Sub-Offset needs a record after the fork offset")
        payload = following[0].payload
        if source.json:
            values = values_of(payload)
            if sub > len(values):
                raise bad_request("Stream-Fork-Sub-Offset is beyond the record's values")
            return b",".join(_dump_values(values[:sub]))
        if sub > len(payload):
            raise bad_request("Stream-Fork-Sub-Offset is beyond the record's bytes")
        return payload[:sub]

    # Deleting -----------------------------------------------------------------------------------

    def delete(self, path: str) -> None:
        with self.lock(path):
            meta = self.metadata.load(path)
            if meta is None:
                raise not_found()
            if meta.expired():
                self._expire(path)
                raise not_found()
            if meta.soft_deleted:
                raise gone("the stream was deleted; forks of it still read its records")
            if meta.forks:
                meta.soft_deleted = True
                self.metadata.save(path, meta)
                return
        self._remove(path, meta)

    def _expire(self, path: str) -> None:
        meta = self.metadata.load(path)
        if meta is None or not meta.expired():
            return
        if meta.forks:
            if not meta.soft_deleted:
                meta.soft_deleted = True
                self.metadata.save(path, meta)
            return
        self._remove(path, meta)

    def _remove(self, path: str, meta: StreamMeta) -> None:
        # Metadata first: once it is gone the stream is gone, whatever happens to the records.
        self.metadata.forget(path)
        self.backend.admin.delete_topic(data_topic(path))
        parent = meta.forked_from
        if parent is None:
            return
        with self.lock(parent):
            parent_meta = self.metadata.load(parent)
            if parent_meta is None:
                return
            parent_meta.forks = tuple(fork for fork in parent_meta.forks if fork != path)
            if parent_meta.soft_deleted and not parent_meta.forks:
                cascade = True
            else:
                cascade = False
                self.metadata.save(parent, parent_meta)
        if cascade:
            self._remove(parent, parent_meta)


def _dump_values(values: list[object]) -> list[bytes]:
    import json

    return [json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode() for value in values]


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
