"""Read answers: catch-up, long-poll and SSE, built from a stream and the ordinal a client is after.

A live reader (long-poll, SSE) opened with an API key asks ``still_valid`` at least every
``check_every`` seconds while it waits or writes: a long-poll whose key was revoked meanwhile is
answered 401 ``key_revoked``, and an SSE response ends with an ``error`` event saying so.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from api.core.app.apps.event_codec import unstamped

from .errors import GatewayError, bad_request, gone, unavailable
from .json_mode import join_fragments
from .offsets import BEGINNING, NOW, Offset, epoch_tag
from .reading import Record, RecordStream, TopicReader
from .streams import Stream, StreamRegistry

__all__ = [
    "KEY_REVOKED",
    "ReadResult",
    "Validity",
    "catch_up",
    "from_the_beginning",
    "key_revoked",
    "long_poll",
    "resolve_after",
    "response_cursor",
    "sse_events",
]

#: Asked while a live reader waits: is the credential that opened it still accepted? ``None``: no credential.
Validity = Callable[[], bool] | None
KEY_REVOKED = "key_revoked"

#: Cursors (``Stream-Cursor``) count 20-second intervals from this instant, as the protocol suggests,
#: so that CDN caches of one interval collapse identical long-polls.
_CURSOR_EPOCH = 1728432000.0  # 2024-10-09T00:00:00Z
_CURSOR_INTERVAL = 20
_READ_TIMEOUT = 10.0
#: A read from the beginning starts again this many times at most when its first record goes meanwhile.
_BEGINNING_ATTEMPTS = 3
_LINE_BREAKS = re.compile(r"\r\n|\r|\n")


@dataclasses.dataclass(slots=True)
class ReadResult:
    status: int
    body: bytes
    headers: dict[str, str]


def resolve_after(stream: Stream, offset: Offset) -> tuple[int, str]:
    """The ordinal after which a read starts, and the digest of the record there when the offset names it.

    Raises:
        GatewayError: 410 for an offset of another incarnation, behind retention, or naming a record the
            stream no longer holds (``history_diverged``: the store lost it, a failover); 400 for an
            offset without a digest past the stream's tail (no record has been there).
    """
    info = stream.info
    if offset is BEGINNING:
        return info.first_ordinal - 1, ""
    if offset is NOW:
        return info.last_ordinal, info.last_digest
    digest = ""
    if offset.tag == 0:
        after = 0
    elif offset.tag == epoch_tag(info.epoch):
        after, digest = offset.ordinal, offset.digest
        if after > info.last_ordinal:
            if digest:
                raise gone(
                    f"the stream ends at {info.last_ordinal} but this offset follows record {after}: the store no "
                    "longer holds records it delivered (history_diverged)"
                )
            raise bad_request("the offset is past the stream's tail")
        if after == info.last_ordinal and digest and info.last_digest and digest != info.last_digest:
            raise gone(f"record {after} of the stream is not the one this offset follows (history_diverged)")
    elif any(offset.tag == tag and offset.ordinal <= last for tag, last in stream.meta.inherited_tags):
        after = offset.ordinal  # a fork's copy of its source: the source's digests are not the fork's
    else:
        raise gone("the offset belongs to another incarnation of this stream")
    if after < info.first_ordinal - 1:
        raise gone("the offset is behind what the stream retains")
    return after, digest


def response_cursor(client_cursor: str | None) -> str:
    current = int((time.time() - _CURSOR_EPOCH) // _CURSOR_INTERVAL)
    try:
        client = int(client_cursor) if client_cursor else -1
    except ValueError:
        client = -1
    if client < current:
        return str(current)
    # A client already at (or past) this interval: move it on by 1 s to 1 h so it never repeats a cursor.
    return str(client + max(1, math.ceil(random.randint(1, 3600) / _CURSOR_INTERVAL)))


def payload_of(stream: Stream, record: Record) -> bytes:
    return unstamped(record.payload) if stream.run else record.payload


def body_of(stream: Stream, records: list[Record]) -> bytes:
    payloads = [payload_of(stream, record) for record in records]
    return join_fragments(payloads) if stream.json else b"".join(payloads)


def etag(stream: Stream, start: str, end: str, closed: bool) -> str:
    """The ETag of a read of ``stream`` from ``start`` to ``end`` (its path encoded: a path may hold quotes)."""
    path = base64.b64encode(stream.path.encode()).decode()
    return f'"{path}:{start}:{end}{":c" if closed else ""}"'


def catch_up(
    registry: StreamRegistry,
    stream: Stream,
    start: str,
    after: int,
    max_bytes: int,
    if_none_match: str | None,
    digest: str = "",
) -> ReadResult:
    reader = stream.reader(registry.backend)
    records = reader.read(after, stream.tail, max_bytes, _READ_TIMEOUT, digest)
    if not records and after < stream.tail:
        # The records exist but the store delivered none in time: an empty 200 would send the client
        # back for the same offset at once, a 503 tells it to wait.
        raise unavailable("the stream's records could not be read in time; try again shortly")
    last = records[-1].ordinal if records else after
    next_offset = stream.offset(last, reader.digest_of(records[-1]) if records else digest)
    up_to_date = last >= stream.tail
    headers = {"Content-Type": stream.content_type, "Stream-Next-Offset": next_offset}
    if up_to_date:
        headers["Stream-Up-To-Date"] = "true"
    closed = stream.closed and up_to_date
    if closed:
        headers["Stream-Closed"] = "true"
    tag = etag(stream, start, headers["Stream-Next-Offset"], closed)
    headers["ETag"] = tag
    if if_none_match is not None and if_none_match == tag:
        return ReadResult(304, b"", {"ETag": tag})
    return ReadResult(200, body_of(stream, records), headers)


def key_revoked() -> GatewayError:
    return GatewayError(401, f"{KEY_REVOKED}: the API key of this reader was revoked")


def _checked(still_valid: Validity) -> None:
    if still_valid is not None and not still_valid():
        raise key_revoked()


def long_poll(
    registry: StreamRegistry,
    stream: Stream,
    after: int,
    cursor: str | None,
    timeout: float,
    max_bytes: int,
    digest: str = "",
    *,
    still_valid: Validity = None,
    check_every: float = 1.0,
) -> ReadResult:
    """Records after ``after``, waiting up to ``timeout`` for the first (204 when none come).

    Raises:
        GatewayError: (401 ``key_revoked``) ``still_valid`` said no while it waited.
    """
    if after < stream.tail:
        result = catch_up(registry, stream, "", after, max_bytes, None, digest)
        result.headers.pop("ETag", None)
        result.headers["Stream-Cursor"] = response_cursor(cursor)
        return result
    headers = {"Stream-Next-Offset": stream.offset(after, digest), "Stream-Up-To-Date": "true"}
    if stream.closed:
        headers["Stream-Closed"] = "true"
        return ReadResult(204, b"", headers)
    records: list[Record] = []
    reader = stream.reader(registry.backend)
    with reader.open(after, digest) as received:
        deadline = time.monotonic() + timeout
        first = None
        while first is None and (remaining := deadline - time.monotonic()) > 0:
            _checked(still_valid)
            first = received.receive(min(remaining, check_every) if still_valid is not None else remaining)
        if first is not None:
            records.append(first)
            size = len(first.payload)
            while size < max_bytes and (following := received.receive(0)) is not None:
                records.append(following)
                size += len(following.payload)
    headers["Stream-Cursor"] = response_cursor(cursor)
    current = registry.refresh(stream)
    if not records:
        if current.closed:
            headers["Stream-Closed"] = "true"
        return ReadResult(204, b"", headers)
    last = records[-1].ordinal
    headers = {
        "Content-Type": stream.content_type,
        "Stream-Next-Offset": stream.offset(last, reader.digest_of(records[-1])),
        "Stream-Cursor": headers["Stream-Cursor"],
    }
    if last >= current.tail:
        headers["Stream-Up-To-Date"] = "true"
        if current.closed:
            headers["Stream-Closed"] = "true"
    return ReadResult(200, body_of(stream, records), headers)


def _sse(event: str, data: str) -> bytes:
    lines = _LINE_BREAKS.split(data)
    return (f"event: {event}\n" + "".join(f"data:{line}\n" for line in lines) + "\n").encode()


def _control(offset: str, *, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    body: dict[str, object] = {"streamNextOffset": offset}
    if closed:
        body["streamClosed"] = True
    else:
        body["streamCursor"] = cursor or ""
        if up_to_date:
            body["upToDate"] = True
    return _sse("control", json.dumps(body, separators=(",", ":")))


def sse_data(stream: Stream, record: Record, binary: bool) -> bytes:
    payload = payload_of(stream, record)
    if binary:
        return _sse("data", base64.b64encode(payload).decode())
    if stream.json:
        return _sse("data", join_fragments([payload]).decode("utf-8", "replace"))
    return _sse("data", payload.decode("utf-8", "replace"))


def sse_events(
    registry: StreamRegistry,
    stream: Stream,
    after: int,
    cursor: str | None,
    *,
    binary: bool,
    keepalive: float,
    max_duration: float,
    digest: str = "",
    still_valid: Validity = None,
    check_every: float = 1.0,
) -> Iterator[bytes]:
    """Every record after ``after`` as a data event, each followed by a control event; then live ones.

    Ends after the control event that says the stream is closed, or after ``max_duration`` (the client
    reconnects from its last offset), or with an ``error`` event ``key_revoked`` once ``still_valid``
    says no (asked at least every ``check_every`` seconds). Whether a live record is the newest is
    learnt from the subscription (is another one ready?), not from the store: the stream's info is asked
    for only after a quiet ``keepalive`` and to confirm the end of a sealed topic.

    The subscription is entered here, before the first event: an offset the store cannot resume from
    (behind retention, another history) is a 410 answer, not a stream that ends without a word.

    Raises:
        GatewayError: 410 when the store cannot resume after ``after`` (and the record ``digest`` names).
    """
    reader = stream.reader(registry.backend)
    opened = reader.open(after, digest)
    records = opened.__enter__()
    try:
        return _sse_loop(
            registry,
            stream,
            reader,
            records,
            opened,
            (after, digest, cursor),
            binary=binary,
            keepalive=keepalive,
            max_duration=max_duration,
            still_valid=still_valid,
            check_every=check_every,
        )
    except BaseException:
        opened.__exit__(None, None, None)
        raise


def _sse_loop(
    registry: StreamRegistry,
    stream: Stream,
    reader: TopicReader,
    records: RecordStream,
    opened: AbstractContextManager[RecordStream],
    start: tuple[int, str, str | None],
    *,
    binary: bool,
    keepalive: float,
    max_duration: float,
    still_valid: Validity,
    check_every: float,
) -> Iterator[bytes]:
    """:func:`sse_events` once its subscription is entered (``opened``, left here); ``start``: the
    ordinal and digest after which it reads, and the client's ``cursor``."""
    position, position_digest, cursor = start
    deadline = time.monotonic() + max_duration
    next_check = time.monotonic() + check_every
    tail = stream.tail
    closed = stream.closed
    try:
        if position >= tail:
            offset = stream.offset(position, position_digest)
            yield _control(offset, cursor=response_cursor(cursor), up_to_date=True, closed=closed)
            if closed:
                return
        ready: Record | None = None
        while (now := time.monotonic()) < deadline:
            if still_valid is not None and now >= next_check:  # records keep coming: check between them
                next_check = now + check_every
                if not still_valid():
                    yield _revoked_event()
                    return
            if ready is not None:
                record, ready = ready, None
            else:
                received = _poll(records, keepalive if position >= tail else _READ_TIMEOUT, still_valid, check_every)
                if received is _REVOKED:
                    yield _revoked_event()
                    return
                if not isinstance(received, Record):
                    # Quiet, or the subscription ended (a sealed topic's end, or a closed backend).
                    current = registry.refresh(stream)
                    tail, closed = current.tail, current.closed
                    if position >= tail:
                        offset = stream.offset(position, position_digest)
                        yield _control(offset, cursor=response_cursor(cursor), up_to_date=True, closed=closed)
                        if closed:
                            return
                    if received is not None:  # nothing more comes from an ended subscription: reconnect
                        return
                    continue
                record = received
            position, position_digest = record.ordinal, reader.digest_of(record)
            if position >= tail:
                following = records.poll(0)
                if isinstance(following, Record):
                    ready = following
                    tail = following.ordinal
                else:
                    tail = position
                    if following is not None:  # the end of a sealed topic, or of the subscription: ask
                        current = registry.refresh(stream)
                        tail, closed = max(position, current.tail), current.closed
            at_tail = position >= tail
            # One write for the pair: a client that stops reading after the data event still has its control.
            yield sse_data(stream, record, binary) + _control(
                stream.offset(position, position_digest),
                cursor=response_cursor(cursor),
                up_to_date=at_tail,
                closed=closed and at_tail,
            )
            if closed and at_tail:
                return
    finally:
        opened.__exit__(None, None, None)  # entered by sse_events


def _revoked_event() -> bytes:
    body = {"code": KEY_REVOKED, "message": "the API key of this reader was revoked"}
    return _sse("error", json.dumps(body, separators=(",", ":")))


class _Revoked:
    pass


_REVOKED = _Revoked()


def _poll(records: RecordStream, wait: float, still_valid: Validity, check_every: float) -> Any:
    """``records.poll(wait)``, asking ``still_valid`` every ``check_every`` seconds meanwhile: the record,
    ``None`` after a quiet ``wait``, the end of the subscription, or ``_REVOKED``."""
    if still_valid is None:
        return records.poll(wait)
    deadline = time.monotonic() + wait
    while True:
        received = records.poll(max(0.0, min(deadline - time.monotonic(), check_every)))
        if received is not None:
            return received
        if not still_valid():
            return _REVOKED
        if time.monotonic() >= deadline:
            return None


def from_the_beginning(
    registry: StreamRegistry, stream: Stream, offset: Offset, read: Callable[[Stream, int, str], ReadResult]
) -> ReadResult:
    """``read(stream, after, digest)`` from where ``offset`` starts; a read from the beginning whose first record
    retention removed meanwhile starts again at the new first record.

    Retention keeps its own time (on NATS the server's clock, elsewhere a sweep in any process), so the
    first record of a stream read with ``offset=-1`` may go between the stream's info and the read: the
    client asked for whatever comes first, not for an offset behind retention, and gets no 410 for it.

    Raises:
        GatewayError: what ``read`` raises; a 410 for a read from the beginning only when its first
            record went ``_BEGINNING_ATTEMPTS`` times in a row; 404 when the stream itself went.
    """
    attempt = 1
    while True:
        try:
            return read(stream, *resolve_after(stream, offset))
        except GatewayError as exc:
            if offset is not BEGINNING or exc.status != 410 or attempt >= _BEGINNING_ATTEMPTS:
                raise
        attempt += 1
        stream = registry.refresh(stream)
