"""Which request values may reach the database: end-user ids, our own ids and credentials.

A value that cannot be stored or cannot be one of ours is answered here, before any query, so every
database gives the same answer: PostgreSQL refuses NUL characters and over-long strings that SQLite
takes, and both drivers refuse unpaired surrogates (which a JSON ``\\ud800`` escape produces).
"""

from __future__ import annotations

import base64
import binascii
import re

from api.libs.errors import InvalidParamError

__all__ = [
    "MAX_API_KEY_LENGTH",
    "MAX_PASSPORT_LENGTH",
    "MAX_SITE_CODE_LENGTH",
    "MAX_USER_LENGTH",
    "could_be_credential",
    "could_be_our_id",
    "could_be_passport",
    "require_user",
]

#: The lengths of the columns the values are compared with (``workflow_runs.end_user``, ``apps.api_key``,
#: ``apps.site_code``); a passport is a signed token of about 120 characters.
MAX_USER_LENGTH = 255
MAX_API_KEY_LENGTH = 64
MAX_SITE_CODE_LENGTH = 32
MAX_PASSPORT_LENGTH = 1024

# C0 and C1 control characters (NUL among them) and lone surrogates.
_UNSTORABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# Ids are str(uuid.uuid4()): lowercase, hyphenated, 36 characters.
_OUR_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# API keys, site codes and passports are URL-safe tokens: visible ASCII only.
_CREDENTIAL = re.compile(r"[\x21-\x7e]+")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


def require_user(value: object) -> str:
    """The end-user id of a request.

    Raises:
        InvalidParamError: Not a non-blank string of at most 255 characters without control characters.
    """
    if not isinstance(value, str) or not value.strip():
        raise InvalidParamError("'user' is required")
    if len(value) > MAX_USER_LENGTH:
        raise InvalidParamError(f"'user' must be at most {MAX_USER_LENGTH} characters")
    if _UNSTORABLE.search(value):
        raise InvalidParamError("'user' must not contain control characters or unpaired surrogates")
    return value


def could_be_our_id(value: str) -> bool:
    """Whether ``value`` has the shape of a run or task id we generate (anything else is unknown)."""
    return _OUR_ID.fullmatch(value) is not None


def could_be_credential(value: str, max_length: int) -> bool:
    """Whether ``value`` has the shape of a token we issue (anything else is a wrong credential)."""
    return len(value) <= max_length and _CREDENTIAL.fullmatch(value) is not None


def could_be_passport(token: str) -> bool:
    """Whether ``token`` has the shape of a passport we issue, its signature spelled as we spell it.

    The signature (after the last ``.``) is decoded leniently by itsdangerous, which would take a
    padded spelling or one with other unused trailing bits as the genuine signature.
    """
    if not could_be_credential(token, MAX_PASSPORT_LENGTH):
        return False
    signature = token.rpartition(".")[2]
    if _BASE64URL.fullmatch(signature) is None:
        return False
    try:
        raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    except binascii.Error:
        return False
    return base64.urlsafe_b64encode(raw).rstrip(b"=") == signature.encode("ascii")
