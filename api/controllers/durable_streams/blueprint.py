"""HTTP for the gateway: parse a request, authorise it, call the service, write protocol headers."""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

from flask import Blueprint, Response, current_app, request, stream_with_context
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from api.configs import AppConfig
from api.core.durable_stream import CursorUnavailableError, DurableStreamError
from api.extensions.ext_durable_stream import durable_stream, retention_max_age
from api.libs import metrics
from api.libs.errors import TooManyRequestsError
from api.services import credentials, limits
from api.services.credentials import Credential
from api.services.durable_streams_gateway import access, creating, live, writing
from api.services.durable_streams_gateway.creating import CreateRequest
from api.services.durable_streams_gateway.errors import GatewayError, bad_request, unavailable
from api.services.durable_streams_gateway.json_mode import media_type
from api.services.durable_streams_gateway.offsets import OffsetError, parse_offset
from api.services.durable_streams_gateway.reading import cursor_gone_message
from api.services.durable_streams_gateway.streams import Stream, StreamRegistry

logger = logging.getLogger(__name__)

__all__ = ["create_blueprint"]

_TTL = re.compile(r"0|[1-9]\d{0,9}")
_INTEGER = re.compile(r"\d{1,15}")
_CONTENT_TYPE = re.compile(r"[\w.+-]+/[\w.+-]+")
#: The longest Producer-Id or Stream-Seq taken: each is kept in the stream's metadata.
MAX_HEADER_VALUE = 256
_ALLOW_HEADERS = (
    "content-type, authorization, if-none-match, Stream-Seq, Stream-TTL, Stream-Expires-At, Stream-Closed, "
    "Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset"
)
_EXPOSE_HEADERS = (
    "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At, "
    "Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, "
    "etag, content-type, location, retry-after"
)
_METHODS = ["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"]


def create_blueprint(prefix: str) -> Blueprint:
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    bp = Blueprint("durable_streams", __name__, url_prefix=prefix or None)

    @bp.route("/<path:_ignored>", methods=_METHODS, strict_slashes=False)
    def stream(_ignored: str) -> Response:
        return _serve(request.path[len(prefix) :])

    @bp.after_request
    def security_headers(response: Response) -> Response:
        if response.status_code in (204, 304):
            # No body, so no media type: Flask's default (text/html) would misdescribe the answer.
            response.headers.pop("Content-Type", None)
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cross-Origin-Resource-Policy"] = "cross-origin"
        response.headers["Access-Control-Allow-Origin"] = "*"
        response.headers["Access-Control-Allow-Methods"] = ", ".join(_METHODS)
        response.headers["Access-Control-Allow-Headers"] = _ALLOW_HEADERS
        response.headers["Access-Control-Expose-Headers"] = _EXPOSE_HEADERS
        return response

    return bp


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def _registry() -> StreamRegistry:
    backend = durable_stream()
    registry: StreamRegistry | None = current_app.extensions.get("durable_streams_gateway")
    if registry is None or registry.backend is not backend:
        registry = StreamRegistry(backend, max_age=retention_max_age(_config()))
        current_app.extensions["durable_streams_gateway"] = registry
    return registry


def _text(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    response = Response(message, status=status, mimetype="text/plain")
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def _serve(path: str) -> Response:
    method = request.method
    if method == "OPTIONS":
        return Response(status=204)
    started = time.perf_counter()
    try:
        response = _dispatch(method, path)
    except GatewayError as exc:
        response = _text(exc.status, exc.message, exc.headers)
    except CursorUnavailableError as exc:
        response = _text(410, cursor_gone_message(exc))
    except (DurableStreamError, OperationalError, PoolTimeoutError) as exc:
        logger.warning("durable streams gateway: %s %s: the store is unavailable: %s", method, path, exc)
        failure = unavailable()
        response = _text(failure.status, failure.message, failure.headers)
    if response.status_code >= 500 or response.status_code in (401, 403):
        fields = {"method": method, "path": path, "status": response.status_code, **_run_of(path)}
        logger.info("durable streams gateway: %s %s -> %s", method, path, response.status_code, extra=fields)
    _observe(method, response.status_code, time.perf_counter() - started)
    return response


def _run_of(path: str) -> dict[str, str]:
    """The run a gateway path is about (``/runs/<run id>``), as a log line's field."""
    rooted = "/" + path.lstrip("/")
    if not rooted.startswith(access.RUNS_PREFIX):
        return {}
    run_id = rooted[len(access.RUNS_PREFIX) :].split("/", 1)[0]
    return {"workflow_run_id": run_id} if run_id else {}


def _observe(method: str, status: int, seconds: float) -> None:
    metrics.GATEWAY_REQUESTS.tally.add((method, str(status)))
    metrics.GATEWAY_SECONDS.tally.observe((method,), seconds)


def _dispatch(method: str, path: str) -> Response:
    config = _config()
    write = method in ("PUT", "POST", "DELETE")
    target = access.authorize(
        path, request.headers.get("Authorization"), write=write, anonymous=config.DURABLE_STREAMS_GATEWAY_ANONYMOUS
    )
    registry = _registry()
    if method == "PUT":
        return _create(registry, path, target.credential)
    if method == "POST":
        return _append(registry, path, target.credential)
    if method == "DELETE":
        registry.delete(path)
        return Response(status=204)
    if target.run_topic:
        stream = registry.load_run(path, target.run_topic, pending=target.run_pending)
    else:
        stream = registry.load(path)
    if method == "HEAD":
        # An access that keeps the metadata young under age retention, but does not slide a TTL.
        registry.touch(stream, slide=False)
        return _head(stream)
    return _read(registry, stream, _validity(target.credential))


def _validity(credential: Credential | None) -> live.Validity:
    """What a live reader asks while it waits: is the API key that opened it still accepted?"""
    if credential is None:
        return None
    return lambda: credentials.still_valid(credential)


def _body(credential: Credential | None = None) -> bytes:
    """The request's body, counted against its key's bytes a minute (429 beyond, before it is stored)."""
    limit = _config().DURABLE_STREAMS_GATEWAY_MAX_APPEND_BYTES
    if request.content_length is not None and request.content_length > limit:
        raise GatewayError(413, f"the body is larger than {limit} bytes")
    body = request.stream.read(limit + 1)
    if len(body) > limit:
        raise GatewayError(413, f"the body is larger than {limit} bytes")
    if credential is not None:
        with _limited():
            limits.check_gateway_bytes(credential.app_id, len(body))
    return body


@contextlib.contextmanager
def _limited() -> Iterator[None]:
    """A per-key limit's refusal as the protocol answers it: 429 with Retry-After."""
    try:
        yield
    except TooManyRequestsError as exc:
        raise GatewayError(429, f"{exc.code}: {exc.message}", {"Retry-After": str(exc.retry_after)}) from exc


def _header(name: str) -> str | None:
    return request.headers.get(name)


def _create(registry: StreamRegistry, path: str, credential: Credential | None) -> Response:
    if credential is not None:
        with _limited():
            limits.check_gateway_create(credential.app_id)
    forked_from = _header("Stream-Forked-From")
    content_type = _header("Content-Type")
    if not content_type or not _CONTENT_TYPE.fullmatch(media_type(content_type)):
        content_type = None
    ttl_text, expires_text = _header("Stream-TTL"), _header("Stream-Expires-At")
    if ttl_text is not None and expires_text is not None:
        raise bad_request("Stream-TTL and Stream-Expires-At are exclusive")
    ttl = None
    if ttl_text is not None:
        if not _TTL.fullmatch(ttl_text):
            raise bad_request("invalid Stream-TTL")
        ttl = int(ttl_text)
    expires_epoch = None
    if expires_text is not None:
        expires_epoch = _parse_timestamp(expires_text)
    fork_offset = None
    fork_offset_text = _header("Stream-Fork-Offset")
    if fork_offset_text is not None:
        try:
            parsed = parse_offset(fork_offset_text)
        except OffsetError as exc:
            raise bad_request("invalid Stream-Fork-Offset") from exc
        if parsed.tag < 0:
            raise bad_request("invalid Stream-Fork-Offset")
        fork_offset = (parsed.ordinal, parsed.tag)
    sub_text = _header("Stream-Fork-Sub-Offset")
    sub = None
    if sub_text is not None:
        if forked_from is None:
            raise bad_request("Stream-Fork-Sub-Offset needs Stream-Forked-From")
        if not _TTL.fullmatch(sub_text):
            raise bad_request("invalid Stream-Fork-Sub-Offset")
        sub = int(sub_text)
    if forked_from is not None:
        forked_from = _fork_source(forked_from)
    created, stream = creating.create(
        registry,
        path,
        CreateRequest(
            content_type=content_type,
            ttl_seconds=ttl,
            expires_at=expires_text,
            expires_at_epoch=expires_epoch,
            closed=_header("Stream-Closed") == "true",
            body=_body(credential),
            forked_from=forked_from,
            fork_offset=fork_offset,
            fork_sub_offset=sub,
        ),
    )
    response = Response(status=201 if created else 200)
    response.headers["Content-Type"] = stream.content_type
    response.headers["Stream-Next-Offset"] = stream.tail_offset
    if created:
        response.headers["Location"] = request.base_url
    if stream.closed:
        response.headers["Stream-Closed"] = "true"
    return response


def _fork_source(value: str) -> str:
    """``Stream-Forked-From`` names a stream by its path, or by its URL on this gateway."""
    prefix = _mount_prefix()
    if value.startswith(("http://", "https://")):
        try:
            url = urlsplit(value)
        except ValueError as exc:  # e.g. an unbalanced IPv6 bracket
            raise bad_request("Stream-Forked-From is not a URL") from exc
        # A fork copies records from this gateway's store: another server's stream is not reachable here.
        if url.netloc.lower() != request.host.lower():
            raise bad_request("Stream-Forked-From names a stream on another server")
        value = url.path
    if prefix and value.startswith(prefix + "/"):
        value = value[len(prefix) :]
    access.authorize(
        value,
        request.headers.get("Authorization"),
        write=False,
        anonymous=_config().DURABLE_STREAMS_GATEWAY_ANONYMOUS,
    )
    if value.startswith(access.RUNS_PREFIX):
        raise bad_request("a workflow run cannot be forked")
    return value


def _mount_prefix() -> str:
    blueprint = current_app.blueprints.get(request.blueprint or "")
    return (blueprint.url_prefix if blueprint is not None else None) or ""


def _parse_timestamp(text: str) -> float:
    try:
        parsed = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.UTC)
        return parsed.timestamp()
    except (ValueError, OverflowError) as exc:
        raise bad_request("invalid Stream-Expires-At") from exc


def _append(registry: StreamRegistry, path: str, credential: Credential | None) -> Response:
    ids = (_header("Producer-Id"), _header("Producer-Epoch"), _header("Producer-Seq"))
    producer = None
    if any(value is not None for value in ids):
        producer_id, epoch, seq = ids
        if producer_id is None or epoch is None or seq is None:
            raise bad_request("Producer-Id, Producer-Epoch and Producer-Seq go together")
        if not producer_id or len(producer_id) > MAX_HEADER_VALUE:
            raise bad_request(f"Producer-Id must be 1 to {MAX_HEADER_VALUE} characters")
        if not _INTEGER.fullmatch(epoch) or not _INTEGER.fullmatch(seq):
            raise bad_request("Producer-Epoch and Producer-Seq must be non-negative integers")
        producer = writing.Producer(producer_id, int(epoch), int(seq))
    stream_seq = _header("Stream-Seq")
    if stream_seq is not None and len(stream_seq) > MAX_HEADER_VALUE:
        raise bad_request(f"Stream-Seq must be at most {MAX_HEADER_VALUE} characters")
    result = writing.append(
        registry,
        path,
        writing.AppendRequest(
            body=_body(credential),
            content_type=_header("Content-Type"),
            seq=stream_seq,
            producer=producer,
            close=_header("Stream-Closed") == "true",
        ),
    )
    response = Response(status=result.status)
    for key, value in result.headers.items():
        response.headers[key] = value
    return response


def _head(stream: Stream) -> Response:
    response = Response(status=200)
    response.headers["Content-Type"] = stream.content_type
    response.headers["Stream-Next-Offset"] = stream.tail_offset
    response.headers["Cache-Control"] = "no-store"
    if stream.closed:
        response.headers["Stream-Closed"] = "true"
    if stream.meta.ttl_seconds is not None:
        response.headers["Stream-TTL"] = str(stream.meta.ttl_seconds)
    if stream.meta.expires_at is not None:
        response.headers["Stream-Expires-At"] = stream.meta.expires_at
    response.headers["ETag"] = live.etag(stream, "-1", stream.tail_offset, stream.closed)
    return response


def _read(registry: StreamRegistry, stream: Stream, still_valid: live.Validity) -> Response:
    config = _config()
    offsets = request.args.getlist("offset")
    if len(offsets) > 1:
        raise bad_request("one offset parameter at most")
    offset_text = offsets[0] if offsets else None
    if offset_text == "":
        raise bad_request("empty offset")
    try:
        offset = parse_offset(offset_text or "-1")
    except OffsetError as exc:
        raise bad_request(str(exc)) from exc
    live_mode = request.args.get("live")
    if live_mode in ("long-poll", "sse") and offset_text is None:
        raise bad_request(f"live={live_mode} needs an offset")
    if live_mode not in (None, "", "long-poll", "sse"):
        raise bad_request("live must be long-poll or sse")
    after, digest = live.resolve_after(stream, offset)
    registry.touch(stream)
    cursor = request.args.get("cursor")
    max_bytes = config.DURABLE_STREAMS_GATEWAY_MAX_READ_BYTES
    if live_mode == "sse":
        return _sse(registry, stream, after, digest, cursor, still_valid)
    if live_mode == "long-poll":

        def long_poll(read: Stream, at: int, at_digest: str) -> live.ReadResult:
            return live.long_poll(
                registry,
                read,
                at,
                cursor,
                config.DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS,
                max_bytes,
                at_digest,
                still_valid=still_valid,
                check_every=config.CREDENTIAL_CHECK_INTERVAL,
            )

        result = live.from_the_beginning(registry, stream, offset, long_poll)
    elif offset_text == "now":
        body = b"[]" if stream.json else b""
        headers = {
            "Content-Type": stream.content_type,
            "Stream-Next-Offset": stream.tail_offset,
            "Stream-Up-To-Date": "true",
            "Cache-Control": "no-store",
        }
        if stream.closed:
            headers["Stream-Closed"] = "true"
        result = live.ReadResult(200, body, headers)
    else:
        start, if_none_match = offset_text or "-1", _header("If-None-Match")

        def catch_up(read: Stream, at: int, at_digest: str) -> live.ReadResult:
            return live.catch_up(registry, read, start, at, max_bytes, if_none_match, at_digest)

        result = live.from_the_beginning(registry, stream, offset, catch_up)
    response = Response(result.body, status=result.status)
    for key, value in result.headers.items():
        response.headers[key] = value
    if "Content-Type" not in result.headers:
        del response.headers["Content-Type"]
    return response


def _sse(
    registry: StreamRegistry,
    stream: Stream,
    after: int,
    digest: str,
    cursor: str | None,
    still_valid: live.Validity,
) -> Response:
    config = _config()
    kind = media_type(stream.content_type)
    binary = not (kind.startswith("text/") or kind == "application/json")
    events = live.sse_events(
        registry,
        stream,
        after,
        cursor,
        digest=digest,
        binary=binary,
        keepalive=config.DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS,
        max_duration=config.DURABLE_STREAMS_GATEWAY_SSE_MAX_SECONDS,
        still_valid=still_valid,
        check_every=config.CREDENTIAL_CHECK_INTERVAL,
    )

    def guarded() -> Iterator[bytes]:
        try:
            yield from events
        except GatewayError as exc:  # deleted or trimmed under a live reader: end the stream
            logger.info("durable streams gateway: SSE on %s ended: %s", stream.path, exc.message)
        except DurableStreamError as exc:
            logger.warning("durable streams gateway: SSE on %s ended, the store is unavailable: %s", stream.path, exc)

    response = Response(stream_with_context(guarded()), status=200)
    response.headers["Content-Type"] = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    if binary:
        response.headers["Stream-SSE-Data-Encoding"] = "base64"
    response.headers["X-Accel-Buffering"] = "no"
    return response
