"""Compare-and-set publishes from the caller's own thread or greenlet, on a small synchronous connection.

Everything else of the adapter runs on the backend object's loop thread (:mod:`.loop`), and an
append through it pays two thread hand-overs, caller to loop and back: on a small machine each costs
about as much as a third of the round trip to the server. An append is one request and one reply,
so it needs little of a client: this module speaks that subset of the NATS protocol itself (``INFO``,
``CONNECT``, ``SUB`` of one inbox, ``HPUB`` with a reply subject, the reply as ``MSG``/``HMSG``,
``PING``/``PONG``) on a plain socket, in the caller's world: a blocking socket in a thread, gevent's
cooperative socket in a greenlet.

It is a fast path, never a second way of failing:

- The connection is opened on the first publish (a process that only reads never has it), to the
  server the loop's connection is on, with the same credentials (``user``/``password``/``token``, or
  the URL's). TLS, ``creds`` and ``nkeys_seed`` deployments do without it (everything goes through
  the loop), and so does a backend object connected with ``direct_publish=False``.
- One publish at a time: a caller that finds it busy, a publish that could not be sent (no
  connection to the loop's server yet, the connection found closed before sending, a payload above
  the server's limit) returns :data:`UNSENT` and the caller takes the loop's path instead.
- After the request left, a lost connection or no reply within the timeout is an error (the record
  may have been stored, as with any unacknowledged append) and the connection is dropped; the next
  publish opens a new one.

Thread-safety: :meth:`DirectPublisher.publish` may be called from any thread or greenlet of the
process that made the publisher; after ``fork()`` the child makes its own.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Final

from .settings import NatsSettings

__all__ = ["NO_RESPONDERS", "UNSENT", "DirectPublisher", "ProtocolError"]

#: Nothing was sent: publish through the loop instead.
UNSENT: Final = "unsent"
#: The server answered that no stream captures the subject (it was deleted): the loop re-creates it.
NO_RESPONDERS: Final = "no responders"

_CRLF = b"\r\n"
#: After a failed connect, publishes go through the loop for this long before the next attempt.
_RETRY_CONNECT_AFTER = 1.0


class ProtocolError(ConnectionError):
    """The server sent what this client does not understand, or refused it (``-ERR``)."""


class DirectPublisher:
    """A synchronous request/reply connection for compare-and-set publishes; see the module docstring."""

    def __init__(self, settings: NatsSettings, server: Callable[[], urllib.parse.ParseResult | None]) -> None:
        self._settings = settings
        self._server = server
        self.enabled = settings.direct_publish and not (settings.tls or settings.creds or settings.nkeys_seed)
        # The caller's kind of lock: gevent's under monkey-patching, so a waiting greenlet yields.
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._inbox = ""
        self._max_payload = 0
        self._token = 0
        self._retry_at = 0.0
        #: While a reply (or the server's greeting) is awaited: when to give up, whatever else arrives.
        self._deadline: float | None = None

    def close(self) -> None:
        self.enabled = False  # an append racing the close goes to the (closing) loop, not a new socket
        if self._lock.acquire(timeout=self._settings.request_timeout):
            try:
                self._drop()
            finally:
                self._lock.release()

    def publish(self, subject: str, headers: dict[str, str], payload: bytes) -> dict[str, Any] | str:
        """Publish and return the server's JSON reply, :data:`UNSENT` or :data:`NO_RESPONDERS`.

        Raises:
            OSError: The request was sent (perhaps only in part) and no reply came: the connection
                broke or stayed silent for ``request_timeout``. The record may have been stored.
            ValueError: The reply was not JSON.
        """
        if not self.enabled or not self._lock.acquire(blocking=False):
            return UNSENT
        try:
            header_block = _header_block(headers)
            if not self._ready() or len(header_block) + len(payload) > self._max_payload:
                return UNSENT
            sock = self._sock
            assert sock is not None
            self._token += 1
            reply = f"{self._inbox}.{self._token}"
            try:
                sock.settimeout(self._settings.request_timeout)
                size = len(header_block) + len(payload)
                command = b"HPUB %s %s %d %d\r\n" % (subject.encode(), reply.encode(), len(header_block), size)
                sock.sendall(b"".join((command, header_block, payload, _CRLF)))
                self._deadline = time.monotonic() + self._settings.request_timeout
                return self._await_reply(reply.encode())
            except BaseException:
                self._drop()  # a late reply must not be taken for the next request's
                raise
            finally:
                self._deadline = None
        finally:
            self._lock.release()

    # -- the connection -----------------------------------------------------------------------

    def _ready(self) -> bool:
        """Whether an open connection is there (opening one if needed) with nothing unread but pings."""
        if self._sock is not None:
            try:
                self._drain()
                return True
            except OSError:
                self._drop()  # closed while idle (a server restart, a fail-over): nothing was sent yet
        if time.monotonic() < self._retry_at:
            return False
        try:
            self._open()
            return True
        except (OSError, ValueError):
            self._drop()
            self._retry_at = time.monotonic() + _RETRY_CONNECT_AFTER
            return False

    def _open(self) -> None:
        server = self._server()
        if server is None or server.hostname is None:
            raise ConnectionError("the loop's connection is not up")
        settings = self._settings
        sock = socket.create_connection((server.hostname, server.port or 4222), timeout=settings.connect_timeout)
        self._sock = sock
        self._deadline = time.monotonic() + settings.connect_timeout
        try:
            self._greet(sock, server)
        finally:
            self._deadline = None

    def _greet(self, sock: socket.socket, server: urllib.parse.ParseResult) -> None:
        """INFO in, CONNECT and the inbox's SUB out, then a PING answered: the connection is usable."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        info = self._read_line()
        if not info.startswith(b"INFO "):
            raise ProtocolError(f"expected INFO, got {bytes(info[:40])!r}")
        details = json.loads(info[5:])
        if details.get("tls_required"):
            self.enabled = False
            raise ProtocolError("the server requires TLS")
        self._max_payload = int(details.get("max_payload", 0))
        # Random, as nats-py's inboxes are: replies are routed by subject across a cluster, and
        # two processes (forked children) must never share one.
        self._inbox = f"_INBOX.{secrets.token_hex(12)}"
        hello: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "headers": True,
            "no_responders": True,
            "protocol": 1,
            "lang": "python-durable-stream",
            "version": "1",
            "name": self._settings.name,
        }
        hello.update(_credentials(self._settings, server))
        sock.sendall(b"CONNECT %s\r\nSUB %s.* 1\r\nPING\r\n" % (json.dumps(hello).encode(), self._inbox.encode()))
        while True:
            line = self._read_line()
            if line == b"PONG":
                return
            self._control(line)

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        self._buffer.clear()
        self._deadline = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _drain(self) -> None:
        """Answer what the server sent while the connection was idle; raise if it was closed."""
        sock = self._sock
        assert sock is not None
        sock.settimeout(0.0)
        try:
            while True:
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError, TimeoutError):
                    break
                if not data:
                    raise ConnectionResetError("the server closed the connection")
                self._buffer += data
        finally:
            sock.settimeout(self._settings.request_timeout)
        while _CRLF in self._buffer:
            self._control(self._read_line())

    # -- reading ------------------------------------------------------------------------------

    def _await_reply(self, reply: bytes) -> dict[str, Any] | str:
        while True:
            line = self._read_line()
            if line.startswith((b"MSG ", b"HMSG ")):
                fields = line.split()
                size = int(fields[-1])
                body = self._read_exact(size + 2)[:size]
                if fields[1] != reply:
                    continue  # a stale reply can only follow a dropped connection; not this one
                if fields[0] == b"HMSG":
                    header_size = int(fields[-2])
                    status = body[:header_size].split(_CRLF, 1)[0].split()
                    if len(status) > 1 and status[1] == b"503":
                        return NO_RESPONDERS
                    body = body[header_size:]
                answer = json.loads(body)
                if not isinstance(answer, dict):
                    raise ValueError("the publish acknowledgement is not a JSON object")
                return answer
            self._control(line)

    def _control(self, line: bytes) -> None:
        if line == b"PING":
            assert self._sock is not None
            self._sock.sendall(b"PONG\r\n")
        elif line.startswith(b"-ERR"):
            raise ProtocolError(f"the NATS server refused: {bytes(line[5:]).decode(errors='replace')}")
        elif line.startswith(b"MSG ") or line.startswith(b"HMSG "):
            fields = line.split()
            self._read_exact(int(fields[-1]) + 2)  # a late reply to a request given up on
        elif not (line in (b"PONG", b"+OK") or line.startswith(b"INFO ")):
            raise ProtocolError(f"unexpected from the NATS server: {bytes(line[:40])!r}")

    def _read_line(self) -> bytes:
        while True:
            end = self._buffer.find(_CRLF)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 2]
                return line
            self._receive()

    def _read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._receive()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _receive(self) -> None:
        sock = self._sock
        assert sock is not None
        if self._deadline is not None:
            # One deadline for the whole wait: a server that keeps sending (pings) cannot stretch it.
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer from the NATS server in time")
            sock.settimeout(remaining)
        data = sock.recv(65536)
        if not data:
            raise ConnectionResetError("the NATS server closed the connection")
        self._buffer += data


def _header_block(headers: dict[str, str]) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return f"NATS/1.0\r\n{lines}\r\n".encode()


def _credentials(settings: NatsSettings, server: urllib.parse.ParseResult) -> dict[str, str]:
    """What CONNECT carries to authenticate: what nats-py sends for the same settings, in its order."""
    if settings.user is not None and settings.password is not None:
        return {"user": settings.user, "pass": settings.password}
    if settings.token is not None:
        return {"auth_token": settings.token}
    if server.username is not None:
        if server.password is None:
            return {"auth_token": server.username}  # nats://token@host
        return {"user": server.username, "pass": server.password}
    return {}
