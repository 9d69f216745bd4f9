"""The broadcast-channel contract on Redis ``PUBLISH``/``SUBSCRIBE``, plus what is specific to it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis

from api.core.broadcast_channel import BroadcastChannel, create_broadcast_channel
from harness.waiting import wait_until

from .contract import ARRIVAL_DEADLINE, KEY_PREFIX, BroadcastChannelContract, unique_name


class TestRedisPubSub(BroadcastChannelContract):
    def make_channel(self) -> BroadcastChannel:
        return self.make_channel_on(self.shared_redis)

    def make_channel_on(self, redis_client: redis.Redis) -> BroadcastChannel:
        return create_broadcast_channel(redis_client, "pubsub", key_prefix=KEY_PREFIX)

    def _subscribers(self, channel: str) -> int:
        counts = dict(self.shared_redis.pubsub_numsub(channel))
        return int(counts[channel.encode()])

    def test_topic_is_the_prefixed_channel_and_close_unsubscribes(self) -> None:
        name = unique_name()
        channel = f"{KEY_PREFIX}{name}"
        topic = self.make_channel().topic(name)
        with topic.subscribe() as subscription:
            assert self._subscribers(channel) == 1
            # A plain PUBLISH from outside the package reaches the subscription too.
            self.shared_redis.publish(channel, b"external")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"external"
        wait_until(
            lambda: self._subscribers(channel) == 0, ARRIVAL_DEADLINE, what="the server to drop the subscription"
        )

    def test_closing_restores_the_clients_retry_policy(self) -> None:
        expected = self.shared_redis.get_retry()
        assert expected is not None
        topic = self.make_channel().topic(unique_name())
        with topic.subscribe() as subscription:
            topic.publish(b"x")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"x"
        # The subscription's connection is back in the pool, with the policy it was lent out with.
        pool = self.shared_redis.connection_pool
        borrowed = [pool.get_connection() for _ in range(3)]
        try:
            assert all(conn.retry.get_retries() == expected.get_retries() for conn in borrowed)
        finally:
            for conn in borrowed:
                pool.release(conn)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown broadcast channel kind"):
        create_broadcast_channel(redis.Redis(), "kafka")  # type: ignore[arg-type]


# Package-level checks live with the default variant.


def test_importing_the_package_loads_neither_redis_nor_the_app() -> None:
    code = (
        "import sys\n"
        "import api.core.broadcast_channel\n"
        "forbidden = ('redis', 'flask', 'celery', 'gevent', 'api.core.durable_stream', 'api.controllers',"
        " 'api.tasks', 'api.extensions')\n"
        "print(sorted(m for m in sys.modules if m.startswith(forbidden)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]", result.stdout
