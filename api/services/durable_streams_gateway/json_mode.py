"""JSON mode (``application/json`` streams): appends are values or arrays of values, reads are arrays.

A record holds the values of one append as a JSON fragment, ``v1,v2`` (an array's elements, or the one
value): a read joins the fragments of its records into one array, so ``[a]`` then ``b`` reads back as
``[a,b]``. A workflow run's records are single compact values, which are fragments already.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from api.libs.errors import InvalidParamError
from api.libs.request_limits import strict_json

from .errors import bad_request

#: Arrays and objects inside each other that an appended JSON body may hold (twice the API's default).
MAX_DEPTH = 64

__all__ = ["fragment_of", "fragment_of_values", "is_json", "join_fragments", "values_of"]


def is_json(content_type: str) -> bool:
    return media_type(content_type) == "application/json"


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def fragment_of(body: bytes, *, allow_empty: bool = False) -> bytes:
    """The fragment an append of ``body`` stores (``b""`` for ``[]`` when ``allow_empty``).

    Raises:
        GatewayError: 400 for text that is not JSON, and for an empty array unless ``allow_empty``.
    """
    try:
        value = strict_json(body, MAX_DEPTH)  # (NaN and Infinity would reach readers as invalid JSON)
    except (ValueError, InvalidParamError) as exc:
        raise bad_request("invalid JSON") from exc
    if isinstance(value, list):
        if not value:
            if allow_empty:
                return b""
            raise bad_request("empty arrays are not allowed")
        return fragment_of_values(value)
    return fragment_of_values([value])


def fragment_of_values(values: Iterable[Any]) -> bytes:
    """The fragment that holds ``values`` (what :func:`values_of` reads back)."""
    return ",".join(_dump(value) for value in values).encode()


def values_of(fragment: bytes) -> list[Any]:
    result: list[Any] = json.loads(b"[" + fragment + b"]")
    return result


def join_fragments(fragments: Iterable[bytes]) -> bytes:
    return b"[" + b",".join(fragment for fragment in fragments if fragment) + b"]"


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
