"""Protocol offsets: ``<ordinal>_<incarnation>_<digest>``: 16 decimal digits, 16 more, 16 hexadecimal.

The Durable Streams protocol compares offsets as strings (a later record's offset is greater), so the
ordinal comes first, zero-padded. The second part names the topic's incarnation (a digest of its
``TopicInfo.epoch``): an offset from a deleted and re-created stream is recognised and refused rather
than resolved against other data. The third part names the record the offset follows by the library's
digest of the history up to it (``CursorPosition.digest``): a store that no longer holds that record
(a failover to a replica that had not received it, then other records at its place) refuses the offset
with 410 instead of passing the new records off as the continuation. Within one stream the parts after
the ordinal never disturb the ordering: offsets of different records differ in their fixed-width first
part. ``0000000000000000_0000000000000000`` is the protocol's "before everything" (forks send it), valid
in every incarnation; offsets of the previous release (without the digest) are still accepted, and
resume by ordinal alone.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re

__all__ = ["BEGINNING", "NOW", "Offset", "OffsetError", "epoch_tag", "format_offset", "parse_offset"]

_DIGITS = 16
_TAG_SPACE = 10**_DIGITS - 1
_PATTERN = re.compile(r"(\d{16})_(\d{16})(?:_([0-9a-f]{16}))?")
ZERO = "0" * _DIGITS + "_" + "0" * _DIGITS


class OffsetError(ValueError):
    """The offset is not one the gateway could have produced (a 400)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Offset:
    """A parsed offset: ``tag`` 0 means "before everything" in any incarnation; ``digest`` ``""``: not said."""

    ordinal: int
    tag: int
    digest: str = ""


#: ``offset=-1`` (and the all-zero offset): from the first record.
BEGINNING = Offset(0, 0)
#: ``offset=now``: from the tail as of the request.
NOW = Offset(-1, -1)


@functools.lru_cache(maxsize=4096)
def epoch_tag(epoch: str) -> int:
    """The incarnation half of an offset: never 0, which the protocol's zero offset uses.

    Cached: every offset the gateway writes (each SSE event, each append's answer) needs it, and a
    stream's epoch stays the same for its whole life.
    """
    digest = hashlib.blake2b(epoch.encode(), digest_size=8).digest()
    tag: int = 1 + int.from_bytes(digest, "big") % _TAG_SPACE
    return tag


def format_offset(ordinal: int, epoch: str, digest: str = "") -> str:
    """The offset after record ``ordinal`` of incarnation ``epoch``, naming it by ``digest`` when known."""
    text = f"{ordinal:0{_DIGITS}d}_{epoch_tag(epoch):0{_DIGITS}d}"
    return f"{text}_{digest}" if digest and ordinal else text


def parse_offset(text: str) -> Offset:
    """Parse a client's ``offset`` (``-1``, ``now`` or one of ours); raise :class:`OffsetError` otherwise."""
    if text == "-1":
        return BEGINNING
    if text == "now":
        return NOW
    match = _PATTERN.fullmatch(text)
    if match is None:
        raise OffsetError("malformed offset")
    ordinal, tag, digest = int(match.group(1)), int(match.group(2)), match.group(3) or ""
    if (tag == 0 and ordinal != 0) or (ordinal == 0 and digest):
        raise OffsetError("malformed offset")  # no record, no digest: the gateway never writes these
    return Offset(ordinal, tag, digest)
