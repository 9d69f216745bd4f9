"""Appends from the caller's thread on the NATS adapter's synchronous publishing connection.

Observed from the server (``/connz``: which connection the publishes came in on), on private
servers this module starts and stops: uncontended appends skip the loop, a stalled server fails the
append within the timeout with the contract's error, a restart between appends costs no error, the
connection carries the deployment's credentials, and whatever a broken peer sends ends in a clear
error or in the loop's path, never in a wrong acknowledgement.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.durable_stream import CLOSED, DurableStreamUnavailableError, connect
from api.core.durable_stream.adapters.nats.publisher import UNSENT, DirectPublisher, ProtocolError
from api.core.durable_stream.adapters.nats.settings import NatsSettings
from api.core.durable_stream.testing.helpers import drain
from harness.nats_server import NatsServer
from harness.redis_server import free_port
from harness.waiting import wait_until


@pytest.fixture
def monitored() -> Iterator[NatsServer]:
    with NatsServer(monitor_port=free_port()) as server:
        yield server


def _connections(server: NatsServer, name: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.monitor_port}/connz?limit=1000", timeout=5) as reply:
        found = json.load(reply)
    return [conn for conn in found.get("connections", []) if conn.get("name") == name]


def _connections_with(server: NatsServer, name: str, messages: int) -> list[dict[str, Any]]:
    """The connections named ``name`` through which at least ``messages`` came in, once the server says so."""
    found: list[dict[str, Any]] = wait_until(
        lambda: [conn for conn in _connections(server, name) if conn["in_msgs"] >= messages] or None,
        timeout=10,
        what="the server's connection statistics",
    )
    return found


def _the_loop_connection(server: NatsServer, name: str) -> int:
    """The server's id of the backend object's one connection before it appends (the loop's)."""
    conns = _connections(server, name)
    assert len(conns) == 1, "a process that only reads opens one connection"
    return int(conns[0]["cid"])


def _appends_came_around_the_loop(server: NatsServer, name: str, loop_cid: int, messages: int) -> None:
    """``messages`` publishes came in on a connection that is not the loop's, and there are two."""
    busy = _connections_with(server, name, messages)
    assert all(conn["cid"] != loop_cid for conn in busy), "the appends came in on the loop's connection"
    assert len(_connections(server, name)) == 2


def _ordinals_are_dense(backend: Any, topic: str) -> list[bytes]:
    with backend.topic(topic).subscribe_from_beginning() as subscription:
        records = []
        while (record := subscription.receive(timeout=0.5)) not in (None, CLOSED):
            records.append(record)
    payloads = [record.payload for record in records]
    assert len(set(payloads)) == len(payloads), "a record was stored twice"
    return payloads


def test_uncontended_appends_skip_the_loop(monitored: NatsServer) -> None:
    name = f"direct-{uuid.uuid4().hex[:8]}"
    with connect(monitored.url, name=name) as backend:
        topic = backend.topic("direct")
        with topic.subscribe_from_tail():
            pass
        loop_cid = _the_loop_connection(monitored, name)
        for index in range(201):
            topic.append(str(index).encode())
        _appends_came_around_the_loop(monitored, name, loop_cid, 200)
        with topic.subscribe_from_beginning() as subscription:
            assert [r.payload for r in drain(subscription, 201)] == [str(i).encode() for i in range(201)]


def test_direct_publish_off_keeps_one_connection(monitored: NatsServer) -> None:
    name = f"single-{uuid.uuid4().hex[:8]}"
    with connect(monitored.url, name=name, direct_publish=False) as backend:
        topic = backend.topic("single")
        for index in range(50):
            topic.append(str(index).encode())
        conns = _connections_with(monitored, name, 50)
        assert len(_connections(monitored, name)) == 1 and conns, "the appends did not all go through the loop"


def test_concurrent_appends_of_one_backend_stay_dense(monitored: NatsServer) -> None:
    """Threads race for the publishing connection; the losers take the loop, nothing doubles or skips."""
    with connect(monitored.url) as backend:
        topic = backend.topic("racing")
        topic.append(b"first")

        def append(worker: int) -> None:
            for index in range(100):
                topic.append(f"{worker}-{index}".encode())

        threads = [threading.Thread(target=append, args=(worker,)) for worker in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        payloads = _ordinals_are_dense(backend, "racing")
        assert len(payloads) == 601
        for worker in range(6):
            mine = [p for p in payloads if p.startswith(f"{worker}-".encode())]
            assert mine == [f"{worker}-{index}".encode() for index in range(100)]


def test_a_stalled_server_fails_the_append_within_the_timeout(monitored: NatsServer) -> None:
    request_timeout = 0.5
    with connect(monitored.url, request_timeout=request_timeout) as backend:
        topic = backend.topic("stalled")
        for index in range(5):
            topic.append(f"before-{index}".encode())
        monitored.pause()
        try:
            started = time.monotonic()
            with pytest.raises(DurableStreamUnavailableError) as raised:
                topic.append(b"while stalled")
            assert type(raised.value) is DurableStreamUnavailableError
            # Ended by the request timeout (a bounded number of them), not by the server's return.
            assert time.monotonic() - started < 20 * request_timeout
        finally:
            monitored.resume()
        # Each attempt its own payload: one that timed out may have been stored all the same.
        attempts = itertools.count()
        wait_until(lambda: _appended(topic, b"after-%d" % next(attempts)), timeout=15, what="appends to work again")
        payloads = _ordinals_are_dense(backend, "stalled")
        assert payloads[:5] == [f"before-{index}".encode() for index in range(5)]
        assert payloads[-1].startswith(b"after-")
        # Unacknowledged: stored or not, never twice.
        assert all(payload == b"while stalled" or payload.startswith(b"after-") for payload in payloads[5:])
        assert payloads.count(b"while stalled") <= 1


def _appended(topic: Any, payload: bytes) -> bool:
    try:
        topic.append(payload)
    except DurableStreamUnavailableError:
        return False
    return True


def test_a_restart_between_appends_is_not_an_error(monitored: NatsServer) -> None:
    with connect(monitored.url, storage="file") as backend:
        topic = backend.topic("restarted")
        topic.append(b"one")
        topic.append(b"two")  # on the publishing connection, which the restart will close
        monitored.restart()

        def loop_is_back() -> bool:
            try:
                topic.subscribe_from_tail().close()
            except DurableStreamUnavailableError:
                return False
            return True

        wait_until(loop_is_back, timeout=15, what="the loop's connection to come back")
        topic.append(b"three")  # the closed publishing connection is noticed before sending
        assert _ordinals_are_dense(backend, "restarted") == [b"one", b"two", b"three"]


def test_a_publishing_connection_the_server_dropped_as_stale_is_replaced_without_an_error() -> None:
    """Idle, the publishing connection answers no server PING, and the server drops it as stale."""
    config = ("ping_interval: 1s", "ping_max: 1")
    with NatsServer(monitor_port=free_port(), extra_config=config) as server:
        name = f"stale-{uuid.uuid4().hex[:8]}"
        with connect(server.url, name=name) as backend:
            topic = backend.topic("idle")
            topic.append(b"one")
            topic.append(b"two")  # opens the publishing connection
            assert len(_connections(server, name)) == 2
            wait_until(
                lambda: len(_connections(server, name)) == 1,
                timeout=15,
                what="the server to drop the idle publishing connection",
            )
            topic.append(b"three")  # the dropped connection is noticed before sending: no error
            assert _ordinals_are_dense(backend, "idle") == [b"one", b"two", b"three"]
            assert len(_connections(server, name)) == 2, "the publishing connection was not opened again"


@pytest.mark.parametrize(
    ("config", "credentials"),
    [
        ('authorization { user: "app", password: "s3cret" }', "app:s3cret@"),
        ('authorization { token: "tok3n" }', "tok3n@"),
    ],
    ids=["user-password", "token"],
)
def test_the_publishing_connection_carries_the_credentials(config: str, credentials: str) -> None:
    with NatsServer(monitor_port=free_port(), extra_config=(config,)) as server:
        name = f"auth-{uuid.uuid4().hex[:8]}"
        with connect(f"nats://{credentials}127.0.0.1:{server.port}", name=name) as backend:
            topic = backend.topic("authorised")
            loop_cid = _the_loop_connection(server, name)
            for index in range(20):
                topic.append(str(index).encode())
            _appends_came_around_the_loop(server, name, loop_cid, 19)
            assert len(_drained(backend, "authorised")) == 20


def _drained(backend: Any, name: str) -> list[bytes]:
    with backend.topic(name).subscribe_from_beginning() as subscription:
        return [record.payload for record in drain(subscription, 20)]


# -- a broken peer: the protocol client alone ----------------------------------------------------


#: The request timeout of a publisher talking to a :class:`_Peer`.
PEER_REQUEST_TIMEOUT = 1.0


class _Peer:
    """A loopback TCP peer greeting each connection with ``greeting`` and answering a publish with ``answer``."""

    def __init__(self, greeting: bytes, answer: bytes, *, keep_pinging: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.greeting, self.answer = greeting, answer
        self.keep_pinging = keep_pinging
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.greeting)
                _received_until(conn, b"PING\r\n")
                conn.sendall(b"PONG\r\n")
                received = _received_until(conn, b"HPUB")
                if self.answer and b"HPUB" in received:
                    # ``{reply}`` in the answer is the reply subject of the publish received.
                    command = received[received.index(b"HPUB") :].split(b"\r\n", 1)[0].split()
                    conn.sendall(self.answer.replace(b"{reply}", command[2]))
                if self.keep_pinging:
                    conn.settimeout(0.2)
                    with contextlib.suppress(OSError):
                        while True:  # a ping every 0.2 s, never the reply, until the client hangs up
                            conn.sendall(b"PING\r\n")
                            with contextlib.suppress(TimeoutError):
                                if conn.recv(65536) == b"":
                                    break
                with contextlib.suppress(OSError):
                    while conn.recv(65536):  # until the client hangs up
                        pass

    def publisher(self) -> DirectPublisher:
        settings = NatsSettings(servers=(f"nats://127.0.0.1:{self.port}",), request_timeout=PEER_REQUEST_TIMEOUT)
        return DirectPublisher(settings, lambda: urllib.parse.urlparse(f"nats://127.0.0.1:{self.port}"))

    def close(self) -> None:
        self.listener.close()


def _received_until(conn: socket.socket, marker: bytes) -> bytes:
    """What ``conn`` sent up to and including ``marker`` (or until it hung up)."""
    received = b""
    while marker not in received:
        chunk = conn.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


_INFO = b'INFO {"server_id":"x","max_payload":1048576,"headers":true,"client_id":7}\r\n'


@pytest.mark.parametrize(
    ("greeting", "answer", "outcome"),
    [
        (b"HELLO\r\n", b"", "unsent"),
        (b"INFO {not json\r\n", b"", "unsent"),
        (b'INFO {"tls_required":true}\r\n', b"", "unsent"),
        (_INFO, b"-ERR 'Maximum Payload Violation'\r\n", ProtocolError),
        (_INFO, b"WHAT\r\n", ProtocolError),
        (_INFO, b"", TimeoutError),
        (_INFO, b"MSG _INBOX.7x0.1 1 3\r\nabc\r\n", TimeoutError),  # someone else's reply: still waiting
    ],
    ids=["no-info", "bad-info", "tls-only", "err", "garbage", "silence", "foreign-reply"],
)
def test_a_broken_peer_never_yields_an_acknowledgement(greeting: bytes, answer: bytes, outcome: Any) -> None:
    peer = _Peer(greeting, answer)
    publisher = peer.publisher()
    try:
        if outcome == "unsent":
            assert publisher.publish("ds.x", {"Ds-O": "1"}, b"payload") == UNSENT
        else:
            with pytest.raises(outcome):
                publisher.publish("ds.x", {"Ds-O": "1"}, b"payload")
    finally:
        publisher.close()
        peer.close()


def test_a_server_that_keeps_pinging_cannot_stretch_the_wait_for_the_reply() -> None:
    peer = _Peer(_INFO, b"", keep_pinging=True)
    publisher = peer.publisher()
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            publisher.publish("ds.x", {"Ds-O": "1"}, b"payload")
        # One request timeout, not one more for every ping (which would never end).
        assert time.monotonic() - started < 10 * PEER_REQUEST_TIMEOUT
    finally:
        publisher.close()
        peer.close()


def test_the_reply_to_its_own_subject_is_taken() -> None:
    """The peer's protocol is right: an acknowledgement on the publish's reply subject comes back."""
    ack = b'{"stream":"S","seq":7}'
    peer = _Peer(_INFO, b"MSG {reply} 1 %d\r\n%s\r\n" % (len(ack), ack))
    publisher = peer.publisher()
    try:
        assert publisher.publish("ds.x", {"Ds-O": "1"}, b"payload") == {"stream": "S", "seq": 7}
    finally:
        publisher.close()
        peer.close()


def test_a_reply_that_is_not_json_is_an_error() -> None:
    peer = _Peer(_INFO, b"MSG {reply} 1 5\r\nhello\r\n")  # the publisher's own reply subject, not JSON
    publisher = peer.publisher()
    try:
        with pytest.raises(ValueError):
            publisher.publish("ds.x", {"Ds-O": "1"}, b"payload")
    finally:
        publisher.close()
        peer.close()
