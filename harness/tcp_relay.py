"""A TCP relay on a free loopback port in front of one or more HTTP servers, which a test controls.

It stands where a load balancer or a flaky proxy would. Clients (a browser, the SDK, the CLI) talk to
the relay as if it were the server; every accepted connection is relayed to an upstream (round
robin, skipping one that refuses, as a balancer fails over). The test can then do to the clients what
a proxy or a network does:

- cut each connection once the bytes sent *down* to the client reach the budget that ``cut_after()``
  draws for it (``None``: never), with a FIN or an RST at random;
- :meth:`TcpRelay.cut_all`: cut every open connection now, in the middle of whatever it carries;
- :meth:`TcpRelay.refuse`: answer the next matching requests itself (say a load balancer's ``503``
  with ``Retry-After``, see :func:`http_response`) without the server ever seeing them::

    with TcpRelay([("127.0.0.1", port)], cut_after=lambda: rng.randint(600, 6000), rng=rng) as relay:
        client = Client(relay.url, key)   # every connection dies somewhere within its first few KiB

Bytes are counted per TCP connection, across the requests a kept-alive connection carries. HTTP is
looked at only as far as a test needs: a chunk from the client that begins with a request line starts
a request (clients write a request's head in one piece), which is how the relay knows the last request
of each connection (:meth:`TcpRelay.upstream_ports`) and which requests to refuse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
import socket
import struct
import threading
import types
from collections.abc import Callable, Sequence
from typing import Self

__all__ = ["Relayed", "TcpRelay", "http_response"]

CHUNK = 65536
REQUEST_LINE = re.compile(rb"^(GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) (\S+) HTTP/1\.[01]\r\n")


def http_response(status: int, reason: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection."""
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclasses.dataclass
class Relayed:
    """One client connection and what became of it."""

    upstream: int
    down_bytes: int = 0
    #: ``"fin"`` or ``"rst"`` if the relay cut it, else ``""``.
    cut: str = ""
    closed: bool = False


@dataclasses.dataclass
class _Refusal:
    path_fragment: str
    remaining: int
    response: bytes


class _Pair:
    """One client connection and the upstream connection the relay opened for it."""

    def __init__(self, client: socket.socket, server: socket.socket, record: Relayed, budget: int | None) -> None:
        self.client = client
        self.server = server
        self.record = record
        self.budget = budget
        self.upstream_port: int = server.getsockname()[1]
        self.last_path = ""
        self.lock = threading.Lock()

    def close(self, how: str = "") -> None:
        with self.lock:
            if self.record.closed:
                return
            self.record.closed = True
            self.record.cut = how
            for sock in (self.client, self.server):
                with contextlib.suppress(OSError):
                    if how == "rst" and sock is self.client:
                        # SO_LINGER 0: the close sends an RST instead of a FIN. SHUT_RD sends nothing
                        # but wakes the pump blocked in recv(), which would otherwise hold the socket
                        # open past close() (the RST would wait for the client's next byte).
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        sock.shutdown(socket.SHUT_RD)
                    else:
                        sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()


class TcpRelay:
    """Relays ``127.0.0.1:<port>`` to ``upstreams``; see the module docstring. Use as a context manager."""

    def __init__(
        self,
        upstreams: Sequence[tuple[str, int]],
        *,
        cut_after: Callable[[], int | None] = lambda: None,
        rng: random.Random | None = None,
    ) -> None:
        self.upstreams = list(upstreams)
        self.cut_after = cut_after
        self.rng = rng or random.Random(0)
        #: Every connection relayed so far, in the order they came.
        self.connections: list[Relayed] = []
        #: Requests the relay answered itself.
        self.refused = 0
        self._pairs: list[_Pair] = []
        self._refusals: list[_Refusal] = []
        self._lock = threading.Lock()
        self._next = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"tcp-relay-{self.port}", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()

    @property
    def cuts(self) -> int:
        """Connections the relay cut (by budget or :meth:`cut_all`)."""
        return sum(1 for record in self.connections if record.cut)

    def active(self) -> list[Relayed]:
        return [record for record in self.connections if not record.closed]

    def cut_all(self, how: str = "rst") -> int:
        """Cut every open connection now (``"rst"`` or ``"fin"``); returns how many were open."""
        with self._lock:
            pairs = [pair for pair in self._pairs if not pair.record.closed]
        for pair in pairs:
            pair.close(how)
        return len(pairs)

    def refuse(self, path_fragment: str, count: int, response: bytes) -> None:
        """Answer the next ``count`` requests whose path contains ``path_fragment`` with ``response``."""
        with self._lock:
            self._refusals.append(_Refusal(path_fragment, count, response))

    def upstream_ports(self, path_fragment: str) -> list[int]:
        """Upstream-side local ports of the open connections whose last request's path contains the fragment."""
        with self._lock:
            return [
                pair.upstream_port for pair in self._pairs if not pair.record.closed and path_fragment in pair.last_path
            ]

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            # Wakes the accept() in the relay's thread; close() alone would leave it blocked.
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.cut_all("fin")
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _connect_upstream(self) -> tuple[int, socket.socket] | None:
        with self._lock:
            start = self._next
            self._next = (self._next + 1) % len(self.upstreams)
        for offset in range(len(self.upstreams)):
            index = (start + offset) % len(self.upstreams)
            try:
                return index, socket.create_connection(self.upstreams[index], timeout=5)
            except OSError:
                continue
        return None

    def _relay(self, client: socket.socket) -> None:
        connected = self._connect_upstream()
        if connected is None:
            client.close()  # every upstream refused: as a balancer with no healthy backend
            return
        index, server = connected
        server.settimeout(None)
        record = Relayed(upstream=index)
        pair = _Pair(client, server, record, self.cut_after())
        with self._lock:
            self.connections.append(record)
            self._pairs = [known for known in self._pairs if not known.record.closed] + [pair]
        threading.Thread(target=self._pump_up, args=(pair,), daemon=True).start()
        self._pump_down(pair)

    def _pump_up(self, pair: _Pair) -> None:
        try:
            while data := pair.client.recv(CHUNK):
                match = REQUEST_LINE.match(data)
                if match:
                    pair.last_path = match.group(2).decode("latin-1")
                    refusal = self._take_refusal(pair.last_path)
                    if refusal is not None:
                        pair.client.sendall(refusal)
                        break
                pair.server.sendall(data)
        except OSError:
            pass
        pair.close()

    def _pump_down(self, pair: _Pair) -> None:
        record = pair.record
        try:
            while data := pair.server.recv(CHUNK):
                if pair.budget is not None and record.down_bytes + len(data) >= pair.budget:
                    keep = pair.budget - record.down_bytes
                    pair.client.sendall(data[:keep])
                    record.down_bytes += keep
                    pair.close(self.rng.choice(("fin", "rst")))
                    return
                pair.client.sendall(data)
                record.down_bytes += len(data)
        except OSError:
            pass
        pair.close()

    def _take_refusal(self, path: str) -> bytes | None:
        with self._lock:
            for refusal in self._refusals:
                if refusal.remaining > 0 and refusal.path_fragment in path:
                    refusal.remaining -= 1
                    self.refused += 1
                    return refusal.response
        return None
