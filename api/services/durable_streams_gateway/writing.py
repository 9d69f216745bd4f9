"""Appends and closes: content-type rules, JSON mode, ``Stream-Seq`` and idempotent producers.

Producer rules (the protocol's Kafka-style fencing): a new producer starts at sequence 0; a higher
epoch must start at 0 again (403 for a lower one, 400 for a higher one not at 0); a sequence at or
below the last accepted is a duplicate (204, nothing appended); one past it is accepted; anything
further is a gap (409 with the expected sequence). States are kept in the stream's metadata snapshot.

The library has no append that also writes metadata, so a producer's (or a ``Stream-Seq``) write is an
append and then a snapshot, and can stop between the two (a store failure, a dead process). Its record
is therefore tagged with what the snapshot would have said (:mod:`.framing`), and the snapshot records
the data topic's last ordinal it accounts for (``data_tail``). Before such a write, the records after
that point (at most :data:`SCAN_LIMIT`, normally none: every tracked write moves it to the tail) are
read and their tags applied, as if their snapshots had been written: a retry of a write that got as far
as its append is then a duplicate (204), and a retried ``Stream-Seq`` is refused (409), instead of
appending the record again. Plain appends write no snapshot at all (except to slide a TTL or keep the
snapshot younger than age retention; see ``StreamRegistry.touch``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

from api.core.durable_stream import TopicSealedError

from .errors import GatewayError, bad_request, conflict, unavailable
from .framing import Tag, frame, parse_tag
from .json_mode import fragment_of, media_type
from .metadata import ProducerState, StreamMeta
from .streams import Stream, StreamRegistry

__all__ = ["SCAN_LIMIT", "AppendRequest", "AppendResult", "Producer", "append"]

#: A producer silent for this long is forgotten (as the reference servers do).
PRODUCER_STATE_TTL = 7 * 24 * 3600.0
#: Records after the snapshot's ``data_tail`` read for tags before a producer's or Stream-Seq write: a
#: write that failed half-way is recognised while fewer records than this were appended after it.
SCAN_LIMIT = 1000
_SCAN_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Producer:
    id: str
    epoch: int
    seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class AppendRequest:
    body: bytes
    content_type: str | None
    seq: str | None
    producer: Producer | None
    close: bool

    @property
    def tracked(self) -> bool:
        """Whether the write changes metadata (a producer's sequence, the last Stream-Seq)."""
        return self.producer is not None or self.seq is not None


@dataclasses.dataclass(slots=True)
class AppendResult:
    status: int
    headers: dict[str, str]


def append(registry: StreamRegistry, path: str, request: AppendRequest) -> AppendResult:
    with registry.lock(path):
        # A plain append needs only the content type and expiry, which a cached snapshot has right.
        stream = registry.load(path, cached=not request.tracked)
        return _append_locked(registry, stream, request)


def _closed_headers(stream: Stream) -> dict[str, str]:
    return {"Stream-Closed": "true", "Stream-Next-Offset": stream.tail_offset}


def _append_locked(registry: StreamRegistry, stream: Stream, request: AppendRequest) -> AppendResult:
    producer = request.producer
    meta = stream.meta
    reconciled = request.tracked and _reconcile(registry, stream)
    if stream.closed:
        if producer is not None and meta.closed_by == (producer.id, producer.epoch, producer.seq):
            _save_if(reconciled, registry, stream)
            headers = _closed_headers(stream)
            headers.update({"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(producer.seq)})
            return AppendResult(204, headers)
        if not request.body and request.close and producer is None:
            return AppendResult(204, _closed_headers(stream))
        state = None if producer is None else meta.producers.get(producer.id)
        if producer is not None and state is not None and producer.epoch < state.epoch:
            raise GatewayError(403, "stale producer epoch", {"Producer-Epoch": str(state.epoch)})
        raise conflict("the stream is closed", _closed_headers(stream))
    if not request.body:
        if not request.close:
            raise bad_request("an append needs a body (or Stream-Closed: true to close)")
        return _close_only(registry, stream, producer, reconciled)
    if not request.content_type:
        raise bad_request("Content-Type is required")
    if media_type(request.content_type) != media_type(meta.content_type):
        raise conflict("Content-Type does not match the stream's")
    record = fragment_of(request.body) if stream.json else request.body
    if producer is not None:
        verdict = _validate(meta, producer)
        if verdict is not None:
            _save_if(reconciled, registry, stream)
            return verdict
    if request.seq is not None and meta.stream_seq is not None and request.seq <= meta.stream_seq:
        _save_if(reconciled, registry, stream)
        raise conflict("Stream-Seq must increase")
    if meta.framed:
        tag = None
        if request.tracked:
            triple = None if producer is None else (producer.id, producer.epoch, producer.seq)
            tag = Tag(triple, request.seq, request.close)
        record = frame(record, tag)
    topic = registry.backend.topic(stream.topic)
    try:
        topic.append(record)
    except TopicSealedError as exc:
        raise conflict("the stream is closed", _closed_headers(registry.refresh(stream))) from exc
    if request.close:
        topic.seal()
    info = registry.backend.admin.topic_info(stream.topic)
    last = info.last_ordinal if info is not None else stream.tail + 1
    headers = {"Stream-Next-Offset": stream.offset(last, info.last_digest if info is not None else "")}
    if request.close:
        headers["Stream-Closed"] = "true"
    if not request.tracked:
        registry.touch(stream)
        return AppendResult(204, headers)
    now = time.time()
    if producer is not None:
        meta.producers[producer.id] = ProducerState(producer.epoch, producer.seq, now)
        if request.close:
            meta.closed_by = (producer.id, producer.epoch, producer.seq)
    if request.seq is not None:
        meta.stream_seq = request.seq
    meta.touched = now
    # Our record is accounted for when it came right after the tail we read; if another process appended
    # meanwhile, the records after that tail are left for the next tracked write to read.
    meta.data_tail = last if last == stream.tail + 1 else stream.tail
    registry.metadata.save(stream.path, meta)
    if producer is not None:
        headers.update({"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(producer.seq)})
        return AppendResult(200, headers)
    return AppendResult(204, headers)


def _close_only(registry: StreamRegistry, stream: Stream, producer: Producer | None, reconciled: bool) -> AppendResult:
    meta = stream.meta
    if producer is not None:
        verdict = _validate(meta, producer)
        if verdict is not None:
            _save_if(reconciled, registry, stream)
            verdict.headers.update(_closed_headers(stream))
            return verdict
    registry.backend.topic(stream.topic).seal()
    headers = {"Stream-Next-Offset": stream.tail_offset, "Stream-Closed": "true"}
    if producer is None:
        registry.touch(stream)
        return AppendResult(204, headers)
    now = time.time()
    meta.touched = now
    meta.producers[producer.id] = ProducerState(producer.epoch, producer.seq, now)
    meta.closed_by = (producer.id, producer.epoch, producer.seq)
    headers.update({"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(producer.seq)})
    registry.metadata.save(stream.path, meta)
    return AppendResult(204, headers)


def _save_if(changed: bool, registry: StreamRegistry, stream: Stream) -> None:
    """Keep what reconciling learned, so that the next write need not read the same records again."""
    if changed:
        registry.metadata.save(stream.path, stream.meta)


def _reconcile(registry: StreamRegistry, stream: Stream) -> bool:
    """Apply the tags of the records the snapshot has not accounted for; whether there were any."""
    meta = stream.meta
    if not meta.framed or stream.tail <= meta.data_tail:
        return False
    start = max(meta.data_tail, stream.tail - SCAN_LIMIT, stream.info.first_ordinal - 1)
    last = start
    now = time.time()
    scanned = stream.reader(registry.backend).scan(start, stream.tail, _SCAN_TIMEOUT)
    with contextlib.closing(scanned):
        for record in scanned:
            last = record.ordinal
            tag = None if record.tag is None else parse_tag(record.tag)
            if tag is not None:
                _apply(meta, tag, closing=stream.closed and record.ordinal == stream.tail, now=now)
    if last < stream.tail:
        # Deciding without them could append a retried write twice.
        raise unavailable("the stream's latest records could not be read in time; try again shortly")
    meta.data_tail = stream.tail
    return True


def _apply(meta: StreamMeta, tag: Tag, *, closing: bool, now: float) -> None:
    """What the snapshot of a tagged write would have recorded."""
    if tag.producer is not None:
        producer_id, epoch, seq = tag.producer
        state = meta.producers.get(producer_id)
        if state is None or epoch > state.epoch or (epoch == state.epoch and seq > state.seq):
            meta.producers[producer_id] = ProducerState(epoch, seq, now)
        if tag.closes and closing:
            meta.closed_by = tag.producer
    if tag.stream_seq is not None and (meta.stream_seq is None or tag.stream_seq > meta.stream_seq):
        meta.stream_seq = tag.stream_seq


def _validate(meta: StreamMeta, producer: Producer) -> AppendResult | None:
    """``None`` when the write is the producer's next; else the answer that refuses or deduplicates it."""
    now = time.time()
    for key in [key for key, state in meta.producers.items() if now - state.updated > PRODUCER_STATE_TTL]:
        del meta.producers[key]
    state = meta.producers.get(producer.id)
    if state is None:
        if producer.seq != 0:
            raise _gap(0, producer.seq)
        return None
    if producer.epoch < state.epoch:
        raise GatewayError(403, "stale producer epoch", {"Producer-Epoch": str(state.epoch)})
    if producer.epoch > state.epoch:
        if producer.seq != 0:
            raise bad_request("a new producer epoch must start at sequence 0")
        return None
    if producer.seq <= state.seq:
        return AppendResult(204, {"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(state.seq)})
    if producer.seq == state.seq + 1:
        return None
    raise _gap(state.seq + 1, producer.seq)


def _gap(expected: int, received: int) -> GatewayError:
    return GatewayError(
        409,
        "producer sequence gap",
        {"Producer-Expected-Seq": str(expected), "Producer-Received-Seq": str(received)},
    )
