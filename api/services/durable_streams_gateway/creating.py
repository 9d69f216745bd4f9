"""Creating streams (PUT): plain ones and forks, idempotent re-creates, and what a failed one left.

A create takes the data topic (``admin.create_topic``), appends its first records and seal, and writes
the snapshot that makes the stream exist. When it writes records or a seal, a ``pending`` snapshot
comes first: a create that stops half-way then leaves records the next PUT knows to be its own
leftover. Records at a path that no snapshot accounts for are never deleted: they may be a live
stream's whose metadata was lost, so the PUT is refused (409) and they are kept for an operator.

A stream that expires at once (``Stream-TTL: 0``, an ``Expires-At`` in the past) is created as the
protocol says (201, with its tail offset) and removed before the answer: nothing of it stays behind.
"""

from __future__ import annotations

import dataclasses
import time

from api.core.durable_stream import TopicInfo

from .errors import bad_request, conflict, gone, not_found, unavailable
from .framing import frame
from .json_mode import fragment_of, fragment_of_values, is_json, media_type, values_of
from .metadata import StreamMeta, data_topic
from .offsets import epoch_tag
from .reading import TopicReader
from .streams import Stream, StreamRegistry

__all__ = ["DEFAULT_CONTENT_TYPE", "CreateRequest", "create"]

DEFAULT_CONTENT_TYPE = "application/octet-stream"
_COPY_TIMEOUT = 30.0


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


def create(registry: StreamRegistry, path: str, request: CreateRequest) -> tuple[bool, Stream]:
    """Create the stream (``True``) or confirm an identical one (``False``); 409 for a different one."""
    with registry.lock(path):
        existing = registry.metadata.load(path)
        if existing is not None and existing.expired():
            registry.expire(path)
            existing = registry.metadata.load(path)
        if existing is not None and not existing.pending:
            if existing.soft_deleted:
                raise conflict("the stream was deleted but forks of it remain: the path cannot be reused yet")
            info = registry.backend.admin.topic_info(data_topic(path))
            if info is not None and info.epoch == existing.data_epoch:
                return False, _confirm(Stream(path, data_topic(path), existing, info), request)
        # From here on ``existing`` (if any) describes no live stream: a failed create's pending snapshot,
        # or metadata whose records are gone.
        if existing is not None and existing.forked_from is not None and existing.forked_from != request.forked_from:
            registry.unlink_fork(path, existing.forked_from)
        if request.forked_from is not None:
            stream = _create_fork(registry, path, request, existing)
        else:
            stream = _create_plain(registry, path, request, existing)
        if stream.meta.expired():
            registry.remove(path, stream.meta)
        return True, stream


def _confirm(stream: Stream, request: CreateRequest) -> Stream:
    existing = stream.meta
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


def _fresh_topic(registry: StreamRegistry, path: str, leftover: StreamMeta | None) -> TopicInfo:
    """An empty incarnation of the data topic; 409 rather than delete records no metadata accounts for."""
    admin = registry.backend.admin
    info = admin.create_topic(data_topic(path))
    if info.last_ordinal == 0 and not info.sealed:
        return info
    ours = leftover is not None and info.epoch == leftover.data_epoch
    if not ours and info.length > 0:
        raise conflict(
            f"records with no stream metadata are stored at this path (topic {data_topic(path)!r}); they are "
            "kept rather than replaced: delete that topic to reuse the path"
        )
    # A failed create's records, or nothing at all (all trimmed, or sealed when empty): a new incarnation.
    admin.delete_topic(data_topic(path))
    return admin.create_topic(data_topic(path))


def _create_plain(registry: StreamRegistry, path: str, request: CreateRequest, leftover: StreamMeta | None) -> Stream:
    content_type = request.content_type or DEFAULT_CONTENT_TYPE
    initial = _initial_record(content_type, request.body)
    info = _fresh_topic(registry, path, leftover)
    now = time.time()
    meta = StreamMeta(
        content_type=content_type,
        data_epoch=info.epoch,
        created=now,
        touched=now,
        ttl_seconds=request.ttl_seconds,
        expires_at=request.expires_at,
        expires_at_epoch=request.expires_at_epoch,
        framed=True,
    )
    return _finish_create(registry, path, meta, info, [initial] if initial else [], request.closed)


def _initial_record(content_type: str, body: bytes) -> bytes:
    if not body:
        return b""
    return fragment_of(body, allow_empty=True) if is_json(content_type) else body


def _finish_create(
    registry: StreamRegistry, path: str, meta: StreamMeta, info: TopicInfo, records: list[bytes], closed: bool
) -> Stream:
    if records or closed:
        # Until the final snapshot the stream does not exist; this one marks the records as our own.
        pending = meta.copy()
        pending.pending = True
        registry.metadata.save(path, pending)
        topic = registry.backend.topic(data_topic(path))
        for record in records:
            topic.append(frame(record))
        if closed:
            topic.seal()
        written = registry.backend.admin.topic_info(data_topic(path))
        if written is None or written.epoch != info.epoch:
            raise conflict("the stream was deleted while it was being created")
        info = written
    meta.data_tail = info.last_ordinal
    registry.metadata.save(path, meta)
    return Stream(path, data_topic(path), meta, info)


def _create_fork(registry: StreamRegistry, path: str, request: CreateRequest, leftover: StreamMeta | None) -> Stream:
    assert request.forked_from is not None
    source_path = request.forked_from
    source_meta = registry.metadata.load(source_path)
    if source_meta is None or source_meta.pending or source_meta.expired():
        raise not_found("the fork's source stream does not exist")
    if source_meta.soft_deleted:
        raise conflict("the fork's source stream was deleted")
    if request.content_type and media_type(request.content_type) != media_type(source_meta.content_type):
        raise conflict("a fork's content type must be its source's")
    source = registry.load(source_path)
    fork_ordinal = _fork_point(source, request)
    reader = source.reader(registry.backend)
    copied = reader.read(0, fork_ordinal, 1 << 62, _COPY_TIMEOUT)
    if len(copied) != fork_ordinal:
        # Trimmed by retention (the first record is not the first ordinal), or a store too slow to
        # deliver them all in time: the fork cannot be made now, but it could be later.
        if (copied[0].ordinal if copied else source.info.first_ordinal) > 1:
            raise gone("the fork point is no longer retained by the source")
        raise unavailable("the source stream's records could not be read in time; try again shortly")
    records = [record.payload for record in copied]
    sub = request.fork_sub_offset or 0
    if sub > 0:
        records.append(_sub_offset_prefix(source, reader, fork_ordinal, sub))
    if request.body:
        initial = _initial_record(source.content_type, request.body)
        if initial:
            records.append(initial)
    info = _fresh_topic(registry, path, leftover)
    now = time.time()
    ttl, expires_at, expires_epoch = request.ttl_seconds, request.expires_at, request.expires_at_epoch
    if ttl is None and expires_at is None:
        ttl, expires_at, expires_epoch = (source_meta.ttl_seconds, source_meta.expires_at, source_meta.expires_at_epoch)
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
        framed=True,
    )
    with registry.lock(source_path):
        latest = registry.metadata.load(source_path)
        if latest is None or latest.soft_deleted:
            raise conflict("the fork's source stream was deleted")
        if path not in latest.forks:
            latest.forks = (*latest.forks, path)
            registry.metadata.save(source_path, latest)
    return _finish_create(registry, path, meta, info, records, request.closed)


def _fork_point(source: Stream, request: CreateRequest) -> int:
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


def _sub_offset_prefix(source: Stream, reader: TopicReader, ordinal: int, sub: int) -> bytes:
    if ordinal >= source.tail:
        raise bad_request("Stream-Fork-Sub-Offset needs a record after the fork offset")
    following = reader.read(ordinal, ordinal + 1, 1, _COPY_TIMEOUT)
    if not following:  # the record exists (it is before the tail): the store did not deliver it in time
        raise unavailable("the source stream's records could not be read in time; try again shortly")
    payload = following[0].payload
    if source.json:
        values = values_of(payload)
        if sub > len(values):
            raise bad_request("Stream-Fork-Sub-Offset is beyond the record's values")
        return fragment_of_values(values[:sub])
    if sub > len(payload):
        raise bad_request("Stream-Fork-Sub-Offset is beyond the record's bytes")
    return payload[:sub]
