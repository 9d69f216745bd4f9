"""Resume tokens: the library's cursor wrapped for the outside world.

The SSE ``id:`` of every event is a token, never a bare cursor. A token is
``base64url(version ‖ key-id length ‖ key id ‖ nonce ‖ AEAD ciphertext)``, where the AEAD is
AES-256-GCM-SIV (nonce-misuse resistant) when the installed OpenSSL provides it and AES-256-GCM
otherwise; the version byte names the algorithm, so servers with different OpenSSL builds still
read each other's tokens when they support it. The associated data binds the token to the topic,
the app and the end user: a token replayed against another run, app or user fails authentication
exactly like a forged one.

Keys rotate: new tokens use the first configured key; every configured key decrypts.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
import struct

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESGCMSIV
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "InvalidResumeTokenError",
    "ResumeTokenCodec",
    "ResumeTokenKey",
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

    @property
    def algorithm(self) -> str:
        return "AES-256-GCM-SIV" if self._algorithm == _GCM_SIV else "AES-256-GCM"

    def seal(self, cursor: str, *, topic: str, app_id: str, end_user: str) -> str:
        key_id = self._active.key_id.encode()
        nonce = os.urandom(_NONCE_SIZE)
        aead = _aead(self._algorithm, self._active.secret)
        ciphertext = aead.encrypt(nonce, cursor.encode(), _associated_data(topic, app_id, end_user))
        raw = bytes([self._algorithm, len(key_id)]) + key_id + nonce + ciphertext
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

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
            plaintext = _aead(algorithm, key.secret).decrypt(
                nonce, ciphertext, _associated_data(topic, app_id, end_user)
            )
        except InvalidTag as exc:
            raise InvalidResumeTokenError("resume token is not valid for this run and user") from exc
        except UnsupportedAlgorithm as exc:
            raise InvalidResumeTokenError("this server cannot read AES-GCM-SIV resume tokens") from exc
        return plaintext.decode()


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


def _aead(algorithm: int, secret: bytes) -> AESGCM | AESGCMSIV:
    return AESGCMSIV(secret) if algorithm == _GCM_SIV else AESGCM(secret)


def _associated_data(topic: str, app_id: str, end_user: str) -> bytes:
    # Length-prefixed fields, so no two (topic, app, user) triples share an encoding.
    parts = [b"resume-token/v1", topic.encode(), app_id.encode(), end_user.encode()]
    return b"".join(struct.pack(">I", len(part)) + part for part in parts)
