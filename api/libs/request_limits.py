"""What a request may make the server read and parse: a bounded body and bounded, strict JSON.

Both limits hold for every endpoint because they live in the app, not in the views: the body size is
checked before any view runs (``Content-Length``, or the actual size of a chunked body the WSGI
server terminates) and is Flask's ``MAX_CONTENT_LENGTH`` for any later read; the JSON rules are the
app's JSON provider, which every ``request.get_json()`` goes through.
"""

from __future__ import annotations

import io
import json
import math
from array import array
from itertools import accumulate
from typing import IO, Any

from flask import Flask, current_app, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import RequestEntityTooLarge

from api.configs import AppConfig
from api.libs.errors import InvalidParamError

__all__ = ["RequestJSONProvider", "allow_larger_bodies", "init_app", "json_too_deep"]

_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
# Read as signed bytes, an opening bracket is +1 and a closing one -1.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def init_app(app: Flask, config: AppConfig) -> None:
    app.config["MAX_CONTENT_LENGTH"] = config.MAX_REQUEST_BODY_BYTES
    app.json = RequestJSONProvider(app, max_depth=config.MAX_JSON_DEPTH)
    app.before_request(_bound_the_body)


def allow_larger_bodies(app: Flask, limits: dict[str, int]) -> None:
    """Let the views of these endpoints (``blueprint.endpoint``) take bodies up to their own limit (uploads)."""
    app.config.setdefault("REQUEST_BODY_LIMITS", {}).update(limits)


def _bound_the_body() -> None:
    """Refuse a body over the limit before any view runs, whether or not the view reads it.

    Raises:
        RequestEntityTooLarge: The declared or, for a chunked body, the actual size is over the limit.
    """
    own = current_app.config.get("REQUEST_BODY_LIMITS", {}).get(request.endpoint)
    if own is not None:
        request.max_content_length = own
    limit = request.max_content_length
    if limit is None:
        return
    if request.content_length is not None:
        if request.content_length > limit:
            raise RequestEntityTooLarge()
        return
    environ = request.environ
    if "chunked" not in request.headers.get("Transfer-Encoding", "").lower() or not environ.get(
        "wsgi.input_terminated"
    ):
        return
    # Werkzeug stops reading a chunked body at the limit and hands on the part it read as the whole
    # body, so an oversize body would look truncated (400) instead of too large (413). One byte
    # past the limit tells them apart.
    body = _read_at_most(environ["wsgi.input"], limit + 1)
    if len(body) > limit:
        raise RequestEntityTooLarge()
    environ["wsgi.input"] = io.BytesIO(body)


def _read_at_most(stream: IO[bytes], size: int) -> bytes:
    chunks = []
    while size > 0 and (chunk := stream.read(min(size, 64 * 1024))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class RequestJSONProvider(DefaultJSONProvider):
    """Flask's JSON provider with strict parsing: nesting bounded, ``NaN``/``Infinity`` refused.

    Non-finite numbers are refused because they would come back out in events and responses as
    ``NaN``/``Infinity``, which no strict JSON client can read.
    """

    def __init__(self, app: Flask, *, max_depth: int) -> None:
        super().__init__(app)
        self.max_depth = max_depth

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        """Parse JSON text; bytes must be valid UTF-8, UTF-16 or UTF-32 (no encoded lone surrogates).

        Raises:
            InvalidParamError: The text nests deeper than ``max_depth`` (checked before parsing,
                because the parser recurses once per level and would exhaust the stack first).
            ValueError: The text is not strict JSON.
        """
        return strict_json(s, self.max_depth, **kwargs)


def strict_json(s: str | bytes, max_depth: int, **kwargs: Any) -> Any:
    """Parse JSON text the way the API does (:class:`RequestJSONProvider`), for a body read elsewhere.

    Raises:
        InvalidParamError: The text nests deeper than ``max_depth``.
        ValueError: The text is not strict JSON (``NaN``, ``Infinity``, a number out of range included).
    """
    text, utf8 = _decoded(s)
    if json_too_deep(utf8, max_depth):
        raise InvalidParamError(f"the JSON body nests arrays and objects deeper than {max_depth} levels")
    kwargs.setdefault("parse_constant", _refuse_constant)
    kwargs.setdefault("parse_float", _finite_float)
    return json.loads(text, **kwargs)


def json_too_deep(data: bytes, limit: int) -> bool:
    """Whether UTF-8 JSON text opens more than ``limit`` arrays/objects inside each other.

    Only bytes operations implemented in C (no Python step per character), so a 1 MiB body costs
    about as much as parsing it. Text that is not JSON may be judged too deep where a parser would
    fail early instead; it is refused either way.
    """
    # An escaped backslash or quote must not end a string; dropping escapes first keeps string
    # boundaries where a parser sees them (a backslash outside a string is where a parser stops).
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside_strings = b"".join(unescaped.split(b'"')[::2])
    brackets = outside_strings.translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return False
    depths = accumulate(array("b", brackets.translate(_STEPS)))
    return any(map(limit.__lt__, depths))


def _decoded(s: str | bytes) -> tuple[str, bytes]:
    """The text, and its UTF-8 bytes for :func:`json_too_deep` (whose scan needs one-byte quotes and brackets)."""
    if isinstance(s, str):
        return s, s.encode("utf-8", "surrogatepass")
    encoding = json.detect_encoding(s)
    # Strict, unlike json.loads on bytes, which lets UTF-8-encoded lone surrogates through.
    text = s.decode(encoding)
    return text, bytes(s) if encoding in ("utf-8", "utf-8-sig") else text.encode("utf-8")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is out of range")
    return value
