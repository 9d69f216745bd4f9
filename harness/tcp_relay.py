"""A TCP relay in front of one or more servers that a test controls: it cuts connections on purpose.

It stands where a load balancer or a flaky proxy would: every accepted connection is relayed to an
upstream (round robin, skipping one that refuses, as a balancer fails over), and is cut — a FIN or
an RST, at random — once the number of bytes sent *down* to the client reaches the budget that
``cut_after()`` draws for it (``None``: never), or when the test calls :meth:`TcpRelay.cut_all`::

    with TcpRelay([("127.0.0.1", port)], cut_after=lambda: rng.randint(600, 6000), rng=rng) as relay:
        client = Client(relay.url, key)   # every connection dies somewhere within its first few KiB

Bytes are counted per TCP connection, across the requests a kept-alive connection carries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import socket
import struct
import threading
import types
from collections.abc import Callable, Sequence
from typing import Self

CHUNK = 16384


@dataclasses.dataclass
class Relayed:
    """One client connection and what became of it."""

    upstream: int
    down_bytes: int = 0
    #: ``"fin"`` or ``"rst"`` if the relay cut it, else ``""``.
    cut: str = ""
    closed: bool = False


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket, record: Relayed, budget: int | None) -> None:
        self.client = client
        self.server = server
        self.record = record
        self.budget = budget
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
                sock.close()


class TcpRelay:
    """Relays loopback TCP connections to ``upstreams``; see the module docstring."""

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
        self.connections: list[Relayed] = []
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._next = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcp-relay", daemon=True)

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
        """Cut every open connection now; returns how many."""
        with self._lock:
            pairs = [pair for pair in self._pairs if not pair.record.closed]
        for pair in pairs:
            pair.close(how)
        return len(pairs)

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
            self._pairs.append(pair)
        threading.Thread(target=self._pump_up, args=(pair,), daemon=True).start()
        self._pump_down(pair)

    def _pump_up(self, pair: _Pair) -> None:
        try:
            while data := pair.client.recv(CHUNK):
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
