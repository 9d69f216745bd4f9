"""Sending one exact HTTP request to the API, in-process (Flask test client) or over a socket (http.client).

Both transports take the same :class:`HttpRequest` (a percent-encoded target, raw header values, raw
body bytes, optionally chunked) and answer with the same :class:`Answer`, so a case list gives
comparable results on either. Event streams are never read to their end: a 200 ``text/event-stream``
is an answer by its status alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import json
import threading
from typing import Any, Protocol

from flask.testing import FlaskClient
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from harness.sse import SseMessage, parse_sse

__all__ = ["Answer", "FlaskTransport", "HttpRequest", "HttpTransport", "Transport"]

_CHUNK = 64 * 1024


@dataclasses.dataclass(frozen=True)
class HttpRequest:
    method: str
    target: str  # path and query string, already percent-encoded
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    chunked: bool = False  # send the body with Transfer-Encoding: chunked and no Content-Length


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    #: The parsed JSON body, ``None`` for an event stream or a body that is not JSON.
    body: Any = None

    @property
    def error_code(self) -> str | None:
        """The ``code`` of an error answered as ``{"code", "message", "status", …}``, else ``None``."""
        body = self.body
        if isinstance(body, dict) and {"code", "message", "status"} <= body.keys() and body["status"] == self.status:
            code = body["code"]
            return code if isinstance(code, str) else None
        return None


class Transport(Protocol):
    def send(self, request: HttpRequest) -> Answer: ...

    def read_stream(self, request: HttpRequest) -> list[SseMessage]: ...


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


class FlaskTransport:
    def __init__(self, client: FlaskClient) -> None:
        self.client = client

    def send(self, request: HttpRequest) -> Answer:
        response = self.client.open(self._request(request), buffered=False)
        try:
            if response.mimetype == "text/event-stream":
                return Answer(response.status_code)
            return Answer(response.status_code, _json_or_none(response.get_data()))
        finally:
            response.close()

    def read_stream(self, request: HttpRequest) -> list[SseMessage]:
        response = self.client.open(self._request(request), buffered=False)
        try:
            assert response.status_code == 200, response.get_data(as_text=True)
            return list(parse_sse(response.response))
        finally:
            response.close()

    @staticmethod
    def _request(request: HttpRequest) -> Request:
        path, _, query = request.target.partition("?")
        builder = EnvironBuilder(
            path=path,
            query_string=query,
            method=request.method,
            headers=list(request.headers),
            input_stream=io.BytesIO(request.body) if request.body is not None else None,
        )
        environ = builder.get_environ()
        if request.chunked:
            # What a WSGI server hands over for a chunked body: no length, a stream it terminates.
            environ.pop("CONTENT_LENGTH", None)
            environ["HTTP_TRANSFER_ENCODING"] = "chunked"
            environ["wsgi.input_terminated"] = True
        return Request(environ)


class HttpTransport:
    """http.client over keep-alive connections, one per thread; the target is sent byte for byte."""

    def __init__(self, host: str, port: int, timeout: float = 60) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._local = threading.local()

    def send(self, request: HttpRequest) -> Answer:
        response = self._exchange(request)
        if response.getheader("Content-Type", "").startswith("text/event-stream"):
            self._drop_connection()  # the stream may go on; hanging up is what a client does
            return Answer(response.status)
        data = response.read()
        if response.will_close:
            self._drop_connection()
        return Answer(response.status, _json_or_none(data))

    def read_stream(self, request: HttpRequest) -> list[SseMessage]:
        response = self._exchange(request)
        assert response.status == 200, response.read()
        messages = list(parse_sse([response.read()]))
        self._drop_connection()
        return messages

    def close(self) -> None:
        self._drop_connection()

    def _exchange(self, request: HttpRequest) -> http.client.HTTPResponse:
        connection = self._connection()
        # The server may answer (413) and stop reading before the whole body is sent; the answer is still there.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._write(connection, request)
        try:
            return connection.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            # A keep-alive connection the server had closed meanwhile: once more on a fresh one.
            self._drop_connection()
            connection = self._connection()
            self._write(connection, request)
            return connection.getresponse()

    @staticmethod
    def _write(connection: http.client.HTTPConnection, request: HttpRequest) -> None:
        connection.putrequest(request.method, request.target, skip_accept_encoding=True)
        for name, value in request.headers:
            connection.putheader(name, value)
        body = request.body
        if request.chunked:
            connection.putheader("Transfer-Encoding", "chunked")
        elif body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders()
        if body is None:
            return
        if not request.chunked:
            connection.send(body)
            return
        for start in range(0, len(body), _CHUNK):
            piece = body[start : start + _CHUNK]
            connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        connection.send(b"0\r\n\r\n")

    def _connection(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.connection = connection
        return connection

    def _drop_connection(self) -> None:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None
