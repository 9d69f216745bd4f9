"""A TCP relay a test can freeze and point elsewhere: a replication link, or a service's address.

Two uses in the failover tests:

- on a **replication link** (replica -> relay -> primary): :meth:`SwitchableRelay.freeze` stops moving
  bytes in both directions. What the primary sends meanwhile stays in the relay and is never delivered,
  so the replica really misses those writes. (Stopping the replica with ``SIGSTOP`` would not do: it
  would still apply what already sits in its socket buffer when it resumes.)
- on a **service address** (clients -> relay -> server): :meth:`SwitchableRelay.switch` sends new
  connections to another server and resets the open ones, as a virtual IP or a DNS name moved by
  failover tooling does; clients reconnect and find the promoted server there.

Loopback only; one thread per direction and connection, for tests.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import types
from typing import Self

__all__ = ["SwitchableRelay"]

_CHUNK = 65536


class _Link:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.closed = False
        self.lock = threading.Lock()

    def close(self, *, reset: bool) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                if reset:
                    # SO_LINGER 0: close() sends an RST, which the peer sees at once as a reset connection.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class SwitchableRelay:
    """Relays ``127.0.0.1:<port>`` to ``upstream``; see the module docstring. Use as a context manager."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name=f"switchable-relay-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()

    def freeze(self) -> None:
        """Stop moving bytes, both ways, on every connection (new ones are accepted but frozen too)."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def switch(self, upstream: tuple[str, int]) -> None:
        """Send new connections to ``upstream``, reset the open ones (nothing held is delivered), thaw."""
        with self._lock:
            self._upstream = upstream
            links, self._links = self._links, []
        for link in links:
            link.close(reset=True)
        self._flowing.set()

    def cut_all(self) -> None:
        """Reset every open connection (what is held is dropped)."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close(reset=True)

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.cut_all()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                upstream = self._upstream
            try:
                server = socket.create_connection(upstream, timeout=5)
            except OSError:
                client.close()  # nothing listens there (the server is dead): as a refused connection
                continue
            server.settimeout(None)
            for sock in (client, server):
                # Small messages (replication acknowledgements) must not wait for Nagle's algorithm.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            with self._lock:
                self._links.append(link)
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(link, source, target), daemon=True).start()

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(_CHUNK):
                # Held here while frozen: a switch or close drops it with the connection.
                while not self._flowing.wait(0.05):
                    if link.closed:
                        return
                if link.closed:
                    return
                target.sendall(data)
        except OSError:
            pass
        link.close(reset=False)
