"""Resume tokens: the library's cursor wrapped for the outside world.

The SSE ``id:`` of every event is a token, never a bare cursor. A token is
``base64url(version ‖ key-id length ‖ key id ‖ nonce ‖ AEAD ciphertext)``, where the AEAD is
AES-256-GCM-SIV (nonce-misuse resistant) when the installed OpenSSL provides it and AES-256-GCM
otherwise; the version byte names the algorithm, so servers with different OpenSSL builds still
read each other's tokens when they support it. The associated data binds the token to the topic,
the app and the end user: a token replayed against another run, app or user fails authentication
exactly like a forged one.

Keys rotate: new tokens use the first configured key; every configured key decrypts.

A stream seals one token per event, so the per-token work is kept small: the codec keeps one AEAD
object per key (building one runs the key schedule), :meth:`ResumeTokenCodec.sealer` binds a
:class:`StreamSealer` to one stream's topic, app and user once (the associated data and the token
header are computed once per response), and nonces are sliced from a buffer filled by
``os.urandom`` (:class:`_Nonces`), which is refilled in a forked child so that no two processes
share one. Every nonce is still 96 random bits, fresh per token: the tokens are exactly as strong
as one ``os.urandom(12)`` call per token made them, with AES-GCM as with AES-GCM-SIV.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
import struct
import threading

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "InvalidResumeTokenError",
    "ResumeTokenCodec",
    "ResumeTokenKey",
    "StreamSealer",
    "development_key",
    "gcm_siv_available",
    "parse_keys",
]

_GCM_SIV = 1
_GCM = 2
_NONCE_SIZE = 12
_MAX_TOKEN_LENGTH = 2048
# The alphabet of base64url without padding; the decoder alone would skip or translate anything else.
_TOKEN_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")
DEVELOPMENT_KEY_ID = "dev"
#: How many nonces one os.urandom call fills the buffer with.
_NONCES_PER_FILL = 256
# base64 -> base64url, without the "=" padding the token does not carry.
_URLSAFE = bytes.maketrans(b"+/", b"-_")


class InvalidResumeTokenError(ValueError):
    """The token is malformed, tampered with, made with an unknown key, or belongs elsewhere."""


@dataclasses.dataclass(frozen=True)
class ResumeTokenKey:
    key_id: str
    secret: bytes

    def __post_init__(self) -> None:
        if not self.key_id or len(self.key_id.encode()) > 32 or ":" in self.key_id or "," in self.key_id:
            raise ValueError("a resume-token key id must be 1-32 bytes without ':' or ','")
        if len(self.secret) != 32:
            raise ValueError(f"resume-token key {self.key_id!r} must be 32 bytes (256 bits)")


def parse_keys(setting: str) -> list[ResumeTokenKey]:
    """Parse ``RESUME_TOKEN_KEYS``: ``kid:base64url-32-bytes[,kid:…]``, the first one active."""
    keys = []
    for item in filter(None, (part.strip() for part in setting.split(","))):
        key_id, sep, encoded = item.partition(":")
        if not sep:
            raise ValueError("RESUME_TOKEN_KEYS entries look like '<key id>:<base64url 32-byte key>'")
        try:
            secret = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"resume-token key {key_id!r} is not valid base64url") from exc
        keys.append(ResumeTokenKey(key_id, secret))
    if len({key.key_id for key in keys}) != len(keys):
        raise ValueError("RESUME_TOKEN_KEYS has duplicate key ids")
    return keys


def development_key(secret_key: str) -> ResumeTokenKey:
    """A key derived from ``SECRET_KEY`` (HKDF-SHA256), for development when no keys are configured."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"resume-token/v1").derive(secret_key.encode())
    return ResumeTokenKey(DEVELOPMENT_KEY_ID, derived)


def gcm_siv_available() -> bool:
    try:
        AESGCMSIV(b"\0" * 32).encrypt(b"\0" * _NONCE_SIZE, b"", None)
    except UnsupportedAlgorithm:
        return False
    return True


class ResumeTokenCodec:
    def __init__(self, keys: list[ResumeTokenKey]) -> None:
        if not keys:
            raise ValueError("at least one resume-token key is required")
        self._active = keys[0]
        self._keys = {key.key_id: key for key in keys}
        self._algorithm = _GCM_SIV if gcm_siv_available() else _GCM
        # One AEAD object per (algorithm, key id), made on first use: building one runs the key
        # schedule, which costs more than sealing a cursor. The objects are stateless and thread-safe.
        self._aeads: dict[tuple[int, str], AESGCM | AESGCMSIV] = {}

    @property
    def algorithm(self) -> str:
        return "AES-256-GCM-SIV" if self._algorithm == _GCM_SIV else "AES-256-GCM"

    def sealer(self, *, topic: str, app_id: str, end_user: str) -> StreamSealer:
        """A sealer of this stream's cursors: made once per response, then one call per event."""
        key_id = self._active.key_id.encode()
        return StreamSealer(
            self._aead(self._algorithm, self._active),
            bytes([self._algorithm, len(key_id)]) + key_id,
            _associated_data(topic, app_id, end_user),
        )

    def seal(self, cursor: str, *, topic: str, app_id: str, end_user: str) -> str:
        return self.sealer(topic=topic, app_id=app_id, end_user=end_user).seal(cursor)

    def open(self, token: str, *, topic: str, app_id: str, end_user: str) -> str:
        """Return the cursor inside ``token``.

        Raises:
            InvalidResumeTokenError: For any token this server did not issue for this topic, app and user.
        """
        raw = _decode_canonical(token)
        if len(raw) < 2:
            raise InvalidResumeTokenError("malformed resume token")
        algorithm, key_id_length = raw[0], raw[1]
        if algorithm not in (_GCM_SIV, _GCM):
            raise InvalidResumeTokenError("unsupported resume token version")
        header = 2 + key_id_length
        if len(raw) < header + _NONCE_SIZE + 16:
            raise InvalidResumeTokenError("malformed resume token")
        key = self._keys.get(raw[2:header].decode("utf-8", "replace"))
        if key is None:
            raise InvalidResumeTokenError("resume token made with an unknown key")
        nonce, ciphertext = raw[header : header + _NONCE_SIZE], raw[header + _NONCE_SIZE :]
        try:
            plaintext = self._aead(algorithm, key).decrypt(nonce, ciphertext, _associated_data(topic, app_id, end_user))
        except InvalidTag as exc:
            raise InvalidResumeTokenError("resume token is not valid for this run and user") from exc
        except UnsupportedAlgorithm as exc:
            raise InvalidResumeTokenError("this server cannot read AES-GCM-SIV resume tokens") from exc
        return plaintext.decode()

    def _aead(self, algorithm: int, key: ResumeTokenKey) -> AESGCM | AESGCMSIV:
        aead = self._aeads.get((algorithm, key.key_id))
        if aead is None:
            aead = self._aeads[(algorithm, key.key_id)] = _new_aead(algorithm, key.secret)
        return aead


class StreamSealer:
    """Seals the cursors of one stream (one topic, app and user) with the codec's active key.

    Made by :meth:`ResumeTokenCodec.sealer`; its tokens are the codec's tokens, byte for byte in
    layout, and :meth:`ResumeTokenCodec.open` opens them.
    """

    __slots__ = ("_aead", "_associated_data", "_header")

    def __init__(self, aead: AESGCM | AESGCMSIV, header: bytes, associated_data: bytes) -> None:
        self._aead = aead
        self._header = header
        self._associated_data = associated_data

    @property
    def binding(self) -> bytes:
        """What a token of this sealer is bound to (topic, app, user) and sealed with (the key): two
        sealers with the same binding make interchangeable tokens."""
        return self._header + self._associated_data

    def seal_bytes(self, cursor: str) -> bytes:
        """The token as ASCII bytes (what an SSE ``id:`` line carries)."""
        nonce = _NONCES.take()
        raw = self._header + nonce + self._aead.encrypt(nonce, cursor.encode(), self._associated_data)
        return binascii.b2a_base64(raw, newline=False).translate(_URLSAFE).rstrip(b"=")

    def seal(self, cursor: str) -> str:
        return self.seal_bytes(cursor).decode("ascii")


class _Nonces:
    """96-bit nonces sliced from a buffer of ``os.urandom`` bytes; every byte is handed out once.

    One ``os.urandom`` call (a system call) per token cost more than slicing. The buffer is shared
    by the process and taken under a lock, so two threads never get the same slice; a forked child
    starts with an empty buffer (see ``_reset_after_fork``), so it never repeats its parent's.
    """

    __slots__ = ("_buffer", "_lock", "_offset")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer = b""
        self._offset = 0

    def take(self) -> bytes:
        with self._lock:
            offset = self._offset
            if offset >= len(self._buffer):
                self._buffer, offset = os.urandom(_NONCE_SIZE * _NONCES_PER_FILL), 0
            self._offset = offset + _NONCE_SIZE
            return self._buffer[offset : offset + _NONCE_SIZE]


_NONCES = _Nonces()


def _reset_after_fork() -> None:
    # The child must not hand out the rest of its parent's buffer (the parent does), and a lock
    # held by another thread at the fork would stay held forever.
    global _NONCES
    _NONCES = _Nonces()


os.register_at_fork(after_in_child=_reset_after_fork)


def _decode_canonical(token: str) -> bytes:
    """The bytes of a token in the one encoding :meth:`ResumeTokenCodec.seal` produces.

    Python's decoder is lenient (it ignores characters outside the alphabet, accepts ``+``/``/`` for
    ``-``/``_`` and non-zero trailing bits), so many strings would decode to a genuine token's bytes.
    """
    if not token or len(token) > _MAX_TOKEN_LENGTH or _TOKEN_ALPHABET.fullmatch(token) is None:
        raise InvalidResumeTokenError("malformed resume token")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise InvalidResumeTokenError("malformed resume token") from exc
    if base64.urlsafe_b64encode(raw).rstrip(b"=") != token.encode("ascii"):
        raise InvalidResumeTokenError("malformed resume token")
    return raw


def _new_aead(algorithm: int, secret: bytes) -> AESGCM | AESGCMSIV:
    return AESGCMSIV(secret) if algorithm == _GCM_SIV else AESGCM(secret)


def _associated_data(topic: str, app_id: str, end_user: str) -> bytes:
    # Length-prefixed fields, so no two (topic, app, user) triples share an encoding.
    parts = [b"resume-token/v1", topic.encode(), app_id.encode(), end_user.encode()]
    return b"".join(struct.pack(">I", len(part)) + part for part in parts)
