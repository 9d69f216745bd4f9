"""A TCP relay on a free loopback port in front of one HTTP server, which a test controls.

Clients (a browser, an SDK) talk to the relay as if it were the server. The test can then do to
them what a proxy or a network does: :meth:`TcpRelay.cut_all` closes every open connection in the
middle of whatever it carries, and :meth:`TcpRelay.refuse` answers the next matching requests itself
(say a load balancer's ``503`` with ``Retry-After``) without the server ever seeing them.

HTTP is looked at only as far as a test needs: a chunk from the client that begins with a method
starts a request (clients write a request's head in one piece), which is how the relay knows the
last request of each connection (:meth:`TcpRelay.upstream_ports`) and which requests to refuse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import threading
import types
from typing import Self

__all__ = ["TcpRelay", "http_response"]

REQUEST_LINE = re.compile(rb"^(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+) HTTP/1\.[01]\r\n")


def http_response(status: int, reason: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection."""
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclasses.dataclass
class _Refusal:
    path_fragment: str
    remaining: int
    response: bytes


class _Pair:
    """One client connection and the upstream connection the relay opened for it."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.upstream_port: int = upstream.getsockname()[1]
        self.last_path = ""
        self.closed = threading.Event()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class TcpRelay:
    """Relays ``127.0.0.1:<port>`` to ``upstream``; use as a context manager."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._refusals: list[_Refusal] = []
        #: Requests the relay answered itself, and connections it cut.
        self.refused = 0
        self.cuts = 0
        self._closing = False
        self._thread = threading.Thread(target=self._accept, name=f"relay-{self.port}", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()

    def cut_all(self) -> int:
        """Close every open connection, mid-response or not; returns how many were open."""
        with self._lock:
            pairs = [pair for pair in self._pairs if not pair.closed.is_set()]
        for pair in pairs:
            pair.close()
        self.cuts += len(pairs)
        return len(pairs)

    def refuse(self, path_fragment: str, count: int, response: bytes) -> None:
        """Answer the next ``count`` requests whose path contains ``path_fragment`` with ``response``."""
        with self._lock:
            self._refusals.append(_Refusal(path_fragment, count, response))

    def upstream_ports(self, path_fragment: str) -> list[int]:
        """Upstream-side local ports of the open connections whose last request's path contains the fragment."""
        with self._lock:
            return [
                pair.upstream_port
                for pair in self._pairs
                if not pair.closed.is_set() and path_fragment in pair.last_path
            ]

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut_all()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs = [known for known in self._pairs if not known.closed.is_set()] + [pair]
            threading.Thread(target=self._pump_requests, args=(pair,), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, pair.upstream, pair.client), daemon=True).start()

    def _pump(self, pair: _Pair, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            pair.close()

    def _pump_requests(self, pair: _Pair) -> None:
        try:
            while data := pair.client.recv(65536):
                match = REQUEST_LINE.match(data)
                if match:
                    pair.last_path = match.group(2).decode("latin-1")
                    refusal = self._take_refusal(pair.last_path)
                    if refusal is not None:
                        pair.client.sendall(refusal)
                        return
                pair.upstream.sendall(data)
        except OSError:
            pass
        finally:
            pair.close()

    def _take_refusal(self, path: str) -> bytes | None:
        with self._lock:
            for refusal in self._refusals:
                if refusal.remaining > 0 and refusal.path_fragment in path:
                    refusal.remaining -= 1
                    self.refused += 1
                    return refusal.response
        return None
