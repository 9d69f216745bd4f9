"""Redis Cluster specifics on private three-master clusters started (and stopped) by these tests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from api.core.durable_stream import (
    CLOSED,
    DurableStreamBackend,
    DurableStreamError,
    DurableStreamUnavailableError,
    connect,
)
from api.core.durable_stream.testing.helpers import drain, payloads, waiting_in_receive
from harness.redis_server import RedisClusterProcess, RedisServer, redis_available
from harness.waiting import wait_until
from tests.durable_stream import hooks

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server and redis-cli are needed")

#: The head check's period of the backends whose tests prove that hints, not the check, delivered:
#: long, so that "within half of it" holds however busy the machine is.
HEAD_CHECK = 20.0
#: How long a ``receive()`` of these tests waits at most: what "at once" is measured against.
WAIT = 30.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterProcess]:
    with RedisClusterProcess() as started:
        yield started


@pytest.fixture
def backend(cluster: RedisClusterProcess) -> Iterator[DurableStreamBackend]:
    with connect(cluster.url, key_prefix=f"cl-{uuid.uuid4().hex[:8]}:", poll_interval=HEAD_CHECK) as opened:
        yield opened


def slot_of(server: RedisServer, key: bytes) -> int:
    client = redis.Redis(port=server.port, protocol=2)
    try:
        return int(client.execute_command("CLUSTER", "KEYSLOT", key))
    finally:
        client.close()


def test_each_topic_lives_in_one_slot_and_topics_spread_over_all_nodes(
    cluster: RedisClusterProcess, backend: DurableStreamBackend
) -> None:
    nodes = set()
    for index in range(30):
        name = f"spread-{index}"
        backend.topic(name).append(b"x")
        keys = hooks.redis_keys(backend, name)
        slots = {slot_of(cluster.servers[0], key) for key in keys}
        assert len(slots) == 1
        nodes.add(cluster.node_of_slot(slots.pop()).port)
    assert len(nodes) == 3


def test_one_feed_connection_per_node_serves_topics_on_every_node(
    cluster: RedisClusterProcess, backend: DurableStreamBackend
) -> None:
    names = [f"fan-{index}" for index in range(60)]
    subscriptions = [backend.topic(name).subscribe_from_tail() for name in names for _ in range(3)]
    for subscription in subscriptions:
        subscription.__enter__()
    feed = hooks.redis_feed(backend)
    wait_until(lambda: feed.subscribed_topics() == set(names), timeout=10.0, what="every topic to be subscribed")
    assert feed.link_count() == 3
    for server in cluster.servers:
        listing = server.cli("client", "list")
        feeds = [line for line in listing.splitlines() if f"{hooks.redis_client_name(backend)}:feed" in line]
        assert len(feeds) == 1, listing
    with connect(cluster.url, key_prefix=hooks.redis_settings(backend).key_prefix) as producer:
        started = time.monotonic()
        for name in names:
            producer.topic(name).append(name.encode())
        for index, subscription in enumerate(subscriptions):
            assert [r.payload for r in drain(subscription, 1)] == [names[index // 3].encode()]
        # Hints, not the head check, delivered them.
        assert time.monotonic() - started < HEAD_CHECK / 2
    for subscription in subscriptions:
        subscription.close()


def test_a_watched_topic_follows_its_slot_to_another_node(
    cluster: RedisClusterProcess, backend: DurableStreamBackend
) -> None:
    name = f"moving-{uuid.uuid4().hex}"
    topic = backend.topic(name)
    for payload in payloads(3):
        topic.append(payload)
    meta, stream, _ = hooks.redis_keys(backend, name)
    slot = slot_of(cluster.servers[0], meta)
    source = cluster.node_of_slot(slot)
    target = next(server for server in cluster.servers if server is not source)
    with topic.subscribe_from_beginning() as subscription:
        assert [r.payload for r in drain(subscription, 3)] == payloads(3)
        _migrate_slot(cluster, slot, source, target, [meta, stream])
        assert cluster.node_of_slot(slot) is target
        feed = hooks.redis_feed(backend)
        # The server unsubscribes the moved slot's channels; the feed finds the new node.
        wait_until(
            lambda: name in feed.subscribed_topics() and _link_of(feed, name) == target.address,
            timeout=10.0,
            what="the shared reader to follow the slot",
        )
        with connect(cluster.url, key_prefix=hooks.redis_settings(backend).key_prefix) as producer:
            started = time.monotonic()
            producer.topic(name).append(b"after the move")
            assert [r.payload for r in drain(subscription, 1)] == [b"after the move"]
            assert time.monotonic() - started < HEAD_CHECK / 2
        topic.append(b"and another")
        assert [r.payload for r in drain(subscription, 1)] == [b"and another"]


def test_a_killed_node_fails_its_topics_with_contract_errors_only() -> None:
    with RedisClusterProcess() as private, connect(private.url, socket_timeout=1.0) as backend:
        names = [f"doomed-{index}" for index in range(12)]
        for name in names:
            backend.topic(name).append(b"x")
        victim = private.servers[1]
        on_victim = [
            name
            for name in names
            if private.node_of_slot(slot_of(private.servers[0], hooks.redis_keys(backend, name)[0])) is victim
        ]
        assert on_victim
        subscription = backend.topic(on_victim[0]).subscribe_from_tail()
        subscription.__enter__()
        outcome: list[object] = []
        waiter = threading.Thread(target=lambda: outcome.append(_receive(subscription)))
        waiter.start()
        wait_until(lambda: waiting_in_receive(subscription, waiter), timeout=10.0, what="receive() to block")
        killed_at = time.monotonic()
        victim.kill()
        waiter.join(timeout=WAIT / 2)
        assert outcome and isinstance(outcome[0], DurableStreamUnavailableError), outcome
        # Told by the broken connection, not by the end of the wait.
        assert time.monotonic() - killed_at < WAIT / 2
        assert subscription.receive(timeout=0) is CLOSED
        with pytest.raises(DurableStreamError) as raised:
            backend.topic(on_victim[0]).append(b"y")
        assert type(raised.value) is DurableStreamUnavailableError


def _receive(subscription: object) -> object:
    try:
        return subscription.receive(timeout=WAIT)  # type: ignore[attr-defined]
    except BaseException as exc:
        return exc


def _link_of(feed: object, topic: str) -> str | None:
    for link in hooks.feed_links(feed).values():  # type: ignore[arg-type]
        if topic in link.channels.values():
            return str(link.address)
    return None


def _migrate_slot(
    cluster: RedisClusterProcess, slot: int, source: RedisServer, target: RedisServer, keys: list[bytes]
) -> None:
    """Move one slot with its keys, the way ``redis-cli --cluster reshard`` does it."""
    source_id = source.cli("cluster", "myid").strip()
    target_id = target.cli("cluster", "myid").strip()
    target.cli("cluster", "setslot", str(slot), "importing", source_id)
    source.cli("cluster", "setslot", str(slot), "migrating", target_id)
    client = redis.Redis(port=source.port, protocol=2)
    try:
        client.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
    finally:
        client.close()
    for server in (target, source, *cluster.servers):
        server.cli("cluster", "setslot", str(slot), "node", target_id)
    wait_until(lambda: cluster.node_of_slot(slot) is target, timeout=10.0, what="the slot to move")
