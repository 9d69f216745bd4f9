"""Appends and closes: content-type rules, JSON mode, ``Stream-Seq`` and idempotent producers.

Producer rules (the protocol's Kafka-style fencing): a new producer starts at sequence 0; a higher
epoch must start at 0 again (403 for a lower one, 400 for a higher one not at 0); a sequence at or
below the last accepted is a duplicate (204, nothing appended); one past it is accepted; anything
further is a gap (409 with the expected sequence). States are kept in the stream's metadata snapshot.
"""

from __future__ import annotations

import dataclasses
import time

from api.core.durable_stream import TopicSealedError

from .errors import GatewayError, bad_request, conflict
from .json_mode import fragment_of, media_type
from .metadata import ProducerState, StreamMeta
from .streams import Stream, StreamRegistry

__all__ = ["AppendRequest", "AppendResult", "Producer", "append"]

#: A producer silent for this long is forgotten (as the reference servers do).
PRODUCER_STATE_TTL = 7 * 24 * 3600.0


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


@dataclasses.dataclass(slots=True)
class AppendResult:
    status: int
    headers: dict[str, str]


def append(registry: StreamRegistry, path: str, request: AppendRequest) -> AppendResult:
    with registry.lock(path):
        stream = registry.load(path)
        result = _append_locked(registry, stream, request)
    return result


def _closed_headers(stream: Stream) -> dict[str, str]:
    return {"Stream-Closed": "true", "Stream-Next-Offset": stream.tail_offset}


def _append_locked(registry: StreamRegistry, stream: Stream, request: AppendRequest) -> AppendResult:
    producer = request.producer
    meta = stream.meta
    if stream.closed:
        if producer is not None and meta.closed_by == (producer.id, producer.epoch, producer.seq):
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
        return _close_only(registry, stream, producer)
    if not request.content_type:
        raise bad_request("Content-Type is required")
    if media_type(request.content_type) != media_type(meta.content_type):
        raise conflict("Content-Type does not match the stream's")
    record = fragment_of(request.body) if stream.json else request.body
    if producer is not None:
        verdict = _validate(meta, producer)
        if isinstance(verdict, AppendResult):
            return verdict
    if request.seq is not None and meta.stream_seq is not None and request.seq <= meta.stream_seq:
        raise conflict("Stream-Seq must increase")
    topic = registry.backend.topic(stream.topic)
    try:
        topic.append(record)
    except TopicSealedError as exc:
        raise conflict("the stream is closed", _closed_headers(registry.refresh(stream))) from exc
    if request.close:
        topic.seal()
    info = registry.backend.admin.topic_info(stream.topic)
    offset = stream.offset(info.last_ordinal if info is not None else stream.tail + 1)
    now = time.time()
    if producer is not None:
        meta.producers[producer.id] = ProducerState(producer.epoch, producer.seq, now)
        if request.close:
            meta.closed_by = (producer.id, producer.epoch, producer.seq)
    if request.seq is not None:
        meta.stream_seq = request.seq
    meta.touched = now
    if producer is not None or request.seq is not None or meta.ttl_seconds is not None:
        registry.metadata.save(stream.path, meta)
    headers = {"Stream-Next-Offset": offset}
    if request.close:
        headers["Stream-Closed"] = "true"
    if producer is not None:
        headers.update({"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(producer.seq)})
        return AppendResult(200, headers)
    return AppendResult(204, headers)


def _close_only(registry: StreamRegistry, stream: Stream, producer: Producer | None) -> AppendResult:
    meta = stream.meta
    if producer is not None:
        verdict = _validate(meta, producer)
        if isinstance(verdict, AppendResult):
            if verdict.status == 204:
                verdict.headers.update(_closed_headers(stream))
            return verdict
    registry.backend.topic(stream.topic).seal()
    now = time.time()
    meta.touched = now
    headers = {"Stream-Next-Offset": stream.tail_offset, "Stream-Closed": "true"}
    if producer is not None:
        meta.producers[producer.id] = ProducerState(producer.epoch, producer.seq, now)
        meta.closed_by = (producer.id, producer.epoch, producer.seq)
        headers.update({"Producer-Epoch": str(producer.epoch), "Producer-Seq": str(producer.seq)})
    if producer is not None or meta.ttl_seconds is not None:
        registry.metadata.save(stream.path, meta)
    return AppendResult(204, headers)


def _validate(meta: StreamMeta, producer: Producer) -> AppendResult | None:
    """``None`` when the write is the producer's next; else the answer that refuses or deduplicates it."""
    now = time.time()
    for key in [key for key, state in meta.producers.items() if now - state.updated > PRODUCER_STATE_TTL]:
        del meta.producers[key]
    state = meta.producers.get(producer.id)
    if state is None:
        if producer.seq != 0:
            return _gap(0, producer.seq)
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
    return _gap(state.seq + 1, producer.seq)


def _gap(expected: int, received: int) -> AppendResult:
    raise GatewayError(
        409,
        "producer sequence gap",
        {"Producer-Expected-Seq": str(expected), "Producer-Received-Seq": str(received)},
    )
