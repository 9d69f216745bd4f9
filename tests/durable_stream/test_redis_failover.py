"""A Redis failover never forks a reader silently.

A private primary and an asynchronous replica (``harness.failover.RedisFailover``): the replication
link is frozen by a relay, the primary acknowledges ``lost`` more appends the replica never receives,
the primary is SIGKILLed, the replica promoted (``REPLICAOF NO ONE``) and the clients' address moved to
it, and the topic goes on there with ``after`` other records (sealed or not). Every position handed out
before the failover is then resumed: it continues exactly, or fails with ``CursorUnavailableError``
``history_diverged``; never a silent end (``CLOSED``), a skip, or a record of the other history.
``after`` is below, equal to and above ``lost``, so the new history ends before, exactly at and
after the positions of the lost records (see ``failover_cases.py``).
"""

from __future__ import annotations

import pathlib
import time
import uuid
from collections.abc import Iterator

import pytest

from api.core.durable_stream import DurableStreamUnavailableError, connect
from api.core.durable_stream.testing.helpers import drain
from harness.failover import RedisFailover
from harness.redis_server import redis_available
from harness.sentinel_failover import RedisSentinelFailover
from tests.conformance.test_gateway import gateway_app

from .failover_cases import BEFORE, append_retrying, check_every_position, check_repair, resume

pytestmark = [
    pytest.mark.skipif(not redis_available(), reason="redis-server and redis-cli are needed"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def pair() -> Iterator[RedisFailover]:
    with RedisFailover() as started:
        yield started


@pytest.mark.parametrize("sealed", [False, True], ids=["open", "sealed"])
@pytest.mark.parametrize(("lost", "after"), [(1, 0), (1, 1), (1, 3), (3, 2), (3, 3), (3, 5)])
def test_every_position_resumes_exactly_or_is_refused_after_a_failover(
    pair: RedisFailover, lost: int, after: int, sealed: bool
) -> None:
    check_every_position(pair, lost, after, sealed)


@pytest.mark.parametrize(("lost", "after"), [(1, 0), (3, 2)])
def test_a_producer_that_outlives_the_failover_repairs_it_for_every_reader(
    pair: RedisFailover, lost: int, after: int
) -> None:
    check_repair(pair, lost, after)


@pytest.mark.parametrize(("after", "closed"), [(1, True), (2, True), (4, False)])
def test_every_gateway_offset_reads_exactly_or_is_410_after_a_failover(
    pair: RedisFailover, tmp_path: pathlib.Path, after: int, closed: bool
) -> None:
    lost = 2
    app = gateway_app(tmp_path, pair.url)
    client = app.test_client()
    path, text = f"/failover/{uuid.uuid4().hex}", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text).status_code == 201

    def post(data: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while (response := client.post(path, headers=text, data=data)).status_code == 503:
            assert time.monotonic() < deadline, "the gateway did not reach the promoted replica"
            time.sleep(0.05)
        assert response.status_code == 204, response.data
        return str(response.headers["Stream-Next-Offset"])

    old = [f"o{index}," for index in range(BEFORE + lost)]
    offsets = [post(chunk) for chunk in old[:BEFORE]]
    pair.wait_replicated()
    pair.freeze_replication()
    offsets += [post(chunk) for chunk in old[BEFORE:]]
    pair.fail_over()
    new = [f"n{index}," for index in range(after)]
    for chunk in new:
        post(chunk)
    if closed:
        assert client.post(path, headers={"Stream-Closed": "true"}).status_code == 204
    history = old[:BEFORE] + new
    try:
        for index, offset in enumerate(offsets):
            ordinal = index + 1
            read = client.get(f"{path}?offset={offset}")
            if ordinal <= BEFORE:
                assert read.status_code == 200 and read.data.decode() == "".join(history[ordinal:]), ordinal
            else:
                assert read.status_code == 410 and b"history_diverged" in read.data, (ordinal, read.status_code)
                assert client.get(f"{path}?offset={offset}&live=long-poll").status_code == 410
                sse = client.get(f"{path}?offset={offset}&live=sse", buffered=False)
                assert sse.status_code == 410
                sse.close()
    finally:
        app.extensions["durable_stream"].close()


def test_with_wait_replicas_an_acknowledged_append_survives_the_failover(pair: RedisFailover) -> None:
    name = f"failover-{uuid.uuid4().hex}"
    # A patient writer for the appends the replica acknowledges (a busy machine may take a while), an
    # impatient one for the append it cannot.
    with (
        connect(pair.url, wait_replicas=1, wait_timeout_ms=30_000) as backend,
        connect(pair.url, wait_replicas=1, wait_timeout_ms=300) as impatient,
        connect(pair.url) as reader,
    ):
        topic = backend.topic(name)
        for index in range(BEFORE):
            topic.append(f"old-{index}".encode())  # each one returned after the replica had it
        with reader.topic(name).subscribe_from_beginning() as subscription:
            records = drain(subscription, BEFORE)
        pair.freeze_replication()
        # The replica cannot acknowledge: the append is stored by the primary alone, and says so.
        started = time.monotonic()
        with pytest.raises(DurableStreamUnavailableError, match="acknowledged by 0 of 1 replicas"):
            impatient.topic(name).append(b"unreplicated")
        assert time.monotonic() - started >= 0.3
        pair.fail_over()
        # The promoted server has no replica of its own yet, so a writer that waits for one would fail
        # every append (the cost of the option): this one goes on without.
        on_the_promoted = reader.topic(name)
        append_retrying(on_the_promoted, b"after")
        on_the_promoted.seal()
        # Every append that returned survived: every reader continues exactly.
        for index, record in enumerate(records):
            rest = [f"old-{later}".encode() for later in range(index + 1, BEFORE)] + [b"after"]
            assert resume(reader, name, record.cursor, len(rest), True) == rest


def test_wait_replicas_is_refused_on_a_cluster_url() -> None:
    with pytest.raises(ValueError, match="wait_replicas"):
        connect("redis+cluster://127.0.0.1:1", wait_replicas=1)


@pytest.fixture
def sentinel_pair() -> Iterator[RedisSentinelFailover]:
    with RedisSentinelFailover() as started:
        yield started


# The same checks with Redis Sentinel doing the promotion and the clients following it through a
# ``redis+sentinel://`` URL, as a Dify deployment with REDIS_USE_SENTINEL runs: fewer, before, at and
# after the lost positions; sealed and not.
@pytest.mark.parametrize(("lost", "after", "sealed"), [(3, 2, False), (3, 3, True), (1, 3, True)])
def test_with_sentinel_every_position_resumes_exactly_or_is_refused(
    sentinel_pair: RedisSentinelFailover, lost: int, after: int, sealed: bool
) -> None:
    check_every_position(sentinel_pair, lost, after, sealed)


def test_with_sentinel_a_producer_that_outlives_the_failover_repairs_it(sentinel_pair: RedisSentinelFailover) -> None:
    check_repair(sentinel_pair, 3, 2)
