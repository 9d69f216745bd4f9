"""How a gateway stream's records are stored: one frame byte, a write's tag when it has one, the payload.

The library's records are bare bytes without headers, and a write that needs its metadata saved after
the append (an idempotent producer's sequence, a ``Stream-Seq``) can fail between the two. The record
therefore carries what the save would have recorded: a tagged frame names the producer, its epoch and
sequence, the ``Stream-Seq`` and whether the write closed the stream, so that the next such write finds
it in the records the metadata has not accounted for yet (see :mod:`.writing`) and a retry is not
appended twice. Every record of a framed stream has a frame, so a payload can never pass for a tag.

Layout: ``00 payload`` (untagged) or ``01 <length: 2 bytes, big-endian> <tag: JSON> payload``. Streams
created before framing (their metadata says ``framed: false``) keep bare records.
"""

from __future__ import annotations

import dataclasses
import json

__all__ = ["Tag", "frame", "parse_tag", "unframe"]

_PLAIN = b"\x00"
_TAGGED = b"\x01"
_LENGTH_BYTES = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Tag:
    """What one write did besides its payload: the producer's (id, epoch, seq), its ``Stream-Seq``, a close."""

    producer: tuple[str, int, int] | None = None
    stream_seq: str | None = None
    closes: bool = False

    def encode(self) -> bytes:
        body: dict[str, object] = {}
        if self.producer is not None:
            body["p"] = list(self.producer)
        if self.stream_seq is not None:
            body["s"] = self.stream_seq
        if self.closes:
            body["c"] = 1
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def frame(payload: bytes, tag: Tag | None = None) -> bytes:
    if tag is None:
        return _PLAIN + payload
    encoded = tag.encode()
    # Producer ids and Stream-Seq values are at most 256 characters each: the tag fits two bytes.
    return _TAGGED + len(encoded).to_bytes(_LENGTH_BYTES, "big") + encoded + payload


def unframe(raw: bytes) -> tuple[bytes, bytes | None]:
    """The payload of a stored record and its tag's bytes (``None`` when untagged)."""
    lead = raw[:1]
    if lead == _PLAIN:
        return raw[1:], None
    if lead == _TAGGED and len(raw) >= 1 + _LENGTH_BYTES:
        end = 1 + _LENGTH_BYTES + int.from_bytes(raw[1 : 1 + _LENGTH_BYTES], "big")
        if len(raw) >= end:
            return raw[end:], raw[1 + _LENGTH_BYTES : end]
    # Not a frame the gateway wrote (the topic was written to by hand): the bytes as they are.
    return raw, None


def parse_tag(encoded: bytes) -> Tag | None:
    """The tag, or ``None`` for bytes that are not one (they are then ignored, never trusted)."""
    try:
        body = json.loads(encoded)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    producer = body.get("p")
    stream_seq = body.get("s")
    if producer is not None:
        if not (
            isinstance(producer, list)
            and len(producer) == 3
            and isinstance(producer[0], str)
            and all(isinstance(number, int) and not isinstance(number, bool) for number in producer[1:])
        ):
            return None
        producer = (producer[0], producer[1], producer[2])
    if stream_seq is not None and not isinstance(stream_seq, str):
        return None
    return Tag(producer, stream_seq, body.get("c") == 1)
