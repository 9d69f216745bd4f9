"""The NATS adapter on a private three-node JetStream cluster, with ``replicas=3``.

The whole shared contract suite runs against the cluster URL ``nats://h1:p1,h2:p2,h3:p3`` with every
stream replicated three times: one cluster serves the whole module (started once, about two seconds),
and each set of stream-level options gets its own stream, as on the single server. The leader-kill
test kills the node leading the stream while records are appended and read: no acknowledged record is
lost, and the subscription either continues or fails with ``DurableStreamUnavailableError``.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.durable_stream import (
    CLOSED,
    DurableStreamBackend,
    DurableStreamRecord,
    DurableStreamUnavailableError,
    connect,
)
from api.core.durable_stream.testing import DurableStreamContract
from api.core.durable_stream.testing.helpers import drain_until_closed
from harness.nats_server import NatsCluster
from harness.waiting import wait_until
from tests.durable_stream import hooks

from .test_contract_nats import stream_options

pytestmark = pytest.mark.slow  # handed out first by make test (tests/conftest.py)


@pytest.fixture(scope="module")
def nats_cluster() -> Iterator[NatsCluster]:
    with NatsCluster() as cluster:
        yield cluster


def _connect_when_ready(url: str, **options: Any) -> DurableStreamBackend:
    """Connect once the cluster can place a replicated stream (right after start it may not yet)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return connect(url, **options)
        except DurableStreamUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class TestNatsClusterContract(DurableStreamContract):
    # Every append is replicated to three servers: the bulk tests (20,000 appends) take over a
    # minute on 2 cores and went past the default 120 s once on a busy machine.
    pytestmark = pytest.mark.timeout(300)

    @pytest.fixture(autouse=True)
    def _cluster(self, nats_cluster: NatsCluster) -> None:
        self._url = nats_cluster.url

    def backend_url(self, **options: Any) -> str | None:
        return f"{self._url}?{urllib.parse.urlencode(stream_options({'replicas': 3, **options}))}"

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return _connect_when_ready(self._url, **stream_options({"replicas": 3, **options}))


def test_killing_the_stream_leader_loses_no_acknowledged_record(nats_cluster: NatsCluster) -> None:
    backend = _connect_when_ready(nats_cluster.url, replicas=3, stream="LEADERKILL", subject_prefix="lk")
    try:
        topic = backend.topic("leader-kill")
        acknowledged: list[bytes] = []
        failed = 0
        stop = threading.Event()
        received: list[DurableStreamRecord] = []
        reader_error: list[BaseException] = []

        def append() -> None:
            nonlocal failed
            index = 0
            while not stop.is_set():
                payload = f"r{index}".encode()
                index += 1
                try:
                    topic.append(payload)
                except DurableStreamUnavailableError:
                    failed += 1
                    time.sleep(0.05)
                    continue
                acknowledged.append(payload)

        subscription = topic.subscribe_from_beginning()
        subscription.__enter__()

        def read() -> None:
            try:
                while not stop.is_set():
                    result = subscription.receive(timeout=0.5)
                    if result is CLOSED:
                        return
                    if result is not None:
                        received.append(result)
            except DurableStreamUnavailableError as exc:
                reader_error.append(exc)

        threads = [threading.Thread(target=append), threading.Thread(target=read)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(acknowledged) >= 100, timeout=20, what="appends before the kill")
        leader = hooks.nats_stream_leader(backend)
        victim = next(server for server in nats_cluster.servers if server.name == leader)
        victim.kill()
        before = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= before + 100, timeout=30, what="appends after the leader was killed")
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        subscription.close()
        # Everything acknowledged is there, once and in order (a failed append may be there too).
        topic.seal()
        with topic.subscribe_from_beginning() as check:
            stored = [r.payload for r in drain_until_closed(check, timeout=60)]
        assert len(stored) == len(set(stored))
        positions = {payload: index for index, payload in enumerate(stored)}
        assert all(payload in positions for payload in acknowledged), "an acknowledged record was lost"
        assert [positions[p] for p in acknowledged] == sorted(positions[p] for p in acknowledged)
        # The subscription read a prefix of that history, or failed with the contract's error.
        assert [r.payload for r in received] == stored[: len(received)]
        assert all(isinstance(error, DurableStreamUnavailableError) for error in reader_error)
        assert hooks.nats_stream_leader(backend) not in ("", leader)
    finally:
        backend.close()
