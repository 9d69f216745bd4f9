"""Cursor encoding: versioned, opaque, bound to one topic incarnation.

A cursor carries everything a new subscription needs to resume without trusting anything else:
a digest of (store identity, topic name), the topic's epoch, the ordinal of the record it follows,
that record's digest in the topic's chain (:mod:`._digest`: the history up to it) and its native
position. A checksum makes truncation and corruption detectable. The layout is private; callers see
only an opaque string.

Version 2 added the record's digest. Version 1 cursors (no digest) are still decoded, for one
release, and resume as before: by ordinal, without the check of the history before them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import struct

from ._contract import CursorUnavailableError, TopicCursor
from ._digest import DIGEST_LENGTH, is_digest
from ._driver import Position
from ._observer import REASON_FOREIGN, REASON_MALFORMED

__all__ = ["MAX_EPOCH_BYTES", "MAX_ORDINAL", "CursorCodec", "CursorPosition", "DecodedCursor", "validate_position"]

_VERSION = "2"
_VERSION_1 = "1"  # no record digest; read for one release
_HEADER = struct.Struct(">8sQ")  # topic digest, ordinal
_CHECKSUM_SIZE = 6
_MAX_CURSOR_LENGTH = 1024
_PREFIX = _VERSION + "."
_DIGEST_BYTES = DIGEST_LENGTH // 2
_URLSAFE = bytes.maketrans(b"+/", b"-_")
#: The largest ordinal and the longest epoch (UTF-8) a cursor can carry.
MAX_ORDINAL = 2**64 - 1
MAX_EPOCH_BYTES = 255


@dataclasses.dataclass(frozen=True, slots=True)
class DecodedCursor:
    epoch: str
    position: Position


@dataclasses.dataclass(frozen=True, slots=True)
class CursorPosition:
    """Where a cursor points, as ``DurableStreamAdmin.cursor_position`` reports it.

    ``epoch`` names the topic's incarnation (as ``TopicInfo.epoch``); ``ordinal`` is the ordinal of the
    record the cursor resumes after (``0``: before the first record). ``digest`` names the history up
    to that record (16 hexadecimal characters, chained over every record of the incarnation; ``""``
    when the cursor does not say: one built from an ordinal alone, or of the previous cursor version).
    A cursor built with it (``admin.cursor_after``) resumes only if the store holds that very history,
    and is refused (``history_diverged``) otherwise. It is not part of equality: two positions are the
    same place whatever their digests say.
    """

    epoch: str
    ordinal: int
    digest: str = dataclasses.field(default="", compare=False)


class CursorCodec:
    """Encodes and decodes the cursors of one topic."""

    __slots__ = ("_epoch_field", "digest")

    def __init__(self, identity: str, topic: str) -> None:
        #: Names the (store, topic) pair: equal digests encode equal cursors.
        self.digest = hashlib.blake2b(f"{identity}\0{topic}".encode(), digest_size=8).digest()
        # (epoch, its encoded field), swapped as one object so concurrent encoders never mix them.
        self._epoch_field: tuple[str, bytes] = ("", b"")

    def encode(self, epoch: str, ordinal: int, native: str, digest: str = "") -> TopicCursor:
        """The cursor that resumes strictly after the record with ``ordinal`` (at ``native``, with ``digest``)."""
        cached = self._epoch_field
        if cached[0] != epoch:  # a topic has one epoch at a time: encode it once
            epoch_bytes = epoch.encode()
            cached = self._epoch_field = (epoch, bytes([len(epoch_bytes)]) + epoch_bytes)
        record = _NO_DIGEST if not digest else _DIGEST_FIELD + bytes.fromhex(digest)
        body = _HEADER.pack(self.digest, ordinal) + cached[1] + record + native.encode()
        # binascii + translate: the same text as base64.urlsafe_b64encode, without its Python wrappers
        # (this runs once per delivered record).
        raw = body + hashlib.blake2b(body, digest_size=_CHECKSUM_SIZE).digest()
        text = binascii.b2a_base64(raw, newline=False).translate(_URLSAFE).rstrip(b"=")
        return TopicCursor(_PREFIX + text.decode("ascii"))

    def decode(self, cursor: object) -> DecodedCursor:
        """Return the cursor's contents.

        Raises:
            CursorUnavailableError: The cursor is not a string this codec produced for this topic.
        """
        if not isinstance(cursor, str) or not cursor or len(cursor) > _MAX_CURSOR_LENGTH:
            raise CursorUnavailableError("malformed cursor", reason=REASON_MALFORMED)
        version, dot, text = cursor.partition(".")
        if not dot or version not in (_VERSION, _VERSION_1):
            raise CursorUnavailableError("malformed cursor: unknown version", reason=REASON_MALFORMED)
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError) as exc:
            raise CursorUnavailableError("malformed cursor: bad encoding", reason=REASON_MALFORMED) from exc
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != text:
            raise CursorUnavailableError("malformed cursor: not canonical", reason=REASON_MALFORMED)
        body, checksum = raw[:-_CHECKSUM_SIZE], raw[-_CHECKSUM_SIZE:]
        if len(body) < _HEADER.size + 1 or _checksum(body) != checksum:
            raise CursorUnavailableError("malformed cursor: truncated or corrupted", reason=REASON_MALFORMED)
        digest, ordinal = _HEADER.unpack_from(body)
        if digest != self.digest:
            raise CursorUnavailableError("cursor belongs to another topic", reason=REASON_FOREIGN)
        epoch_length = body[_HEADER.size]
        epoch_end = _HEADER.size + 1 + epoch_length
        epoch_raw = body[_HEADER.size + 1 : epoch_end]
        if not epoch_raw or len(epoch_raw) != epoch_length:
            raise CursorUnavailableError("malformed cursor", reason=REASON_MALFORMED)
        digest = ""
        if version == _VERSION:
            digest_length = body[epoch_end] if epoch_end < len(body) else -1
            if digest_length not in (0, _DIGEST_BYTES) or len(body) < epoch_end + 1 + digest_length:
                raise CursorUnavailableError("malformed cursor", reason=REASON_MALFORMED)
            digest = body[epoch_end + 1 : epoch_end + 1 + digest_length].hex()
            epoch_end += 1 + digest_length
        try:
            epoch = epoch_raw.decode()
            native = body[epoch_end:].decode()
        except UnicodeDecodeError as exc:
            raise CursorUnavailableError("malformed cursor", reason=REASON_MALFORMED) from exc
        return DecodedCursor(epoch=epoch, position=Position(ordinal, native, digest))

    def position(self, cursor: object) -> CursorPosition:
        """The epoch, ordinal and digest of a cursor this codec produced; raises as :meth:`decode` does."""
        decoded = self.decode(cursor)
        return CursorPosition(decoded.epoch, decoded.position.ordinal, decoded.position.digest)


def validate_position(epoch: object, ordinal: object, digest: object = "") -> None:
    """Refuse (``ValueError``) a position no cursor can carry; every epoch, ordinal and digest a topic has fits."""
    if isinstance(ordinal, bool) or not isinstance(ordinal, int) or not 0 <= ordinal <= MAX_ORDINAL:
        raise ValueError(f"ordinal must be an integer from 0 to {MAX_ORDINAL}")
    if not isinstance(epoch, str) or not epoch or len(epoch.encode()) > MAX_EPOCH_BYTES:
        raise ValueError(f"epoch must be a non-empty string of at most {MAX_EPOCH_BYTES} UTF-8 bytes")
    if digest != "" and not is_digest(digest):
        raise ValueError(f"digest must be empty or {DIGEST_LENGTH} lowercase hexadecimal characters")


_NO_DIGEST = bytes([0])
_DIGEST_FIELD = bytes([_DIGEST_BYTES])


def _checksum(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=_CHECKSUM_SIZE).digest()
