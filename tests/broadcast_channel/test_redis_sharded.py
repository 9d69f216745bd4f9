"""The broadcast-channel contract on Redis sharded pub/sub (``SPUBLISH``/``SSUBSCRIBE``) on a plain server."""

from __future__ import annotations

from typing import Any

import redis

from api.core.broadcast_channel import BroadcastChannel, create_broadcast_channel
from harness.waiting import wait_until

from .contract import ARRIVAL_DEADLINE, KEY_PREFIX, BroadcastChannelContract, unique_name


class TestRedisSharded(BroadcastChannelContract):
    def make_channel(self) -> BroadcastChannel:
        return self.make_channel_on(self.shared_redis)

    def make_channel_on(self, redis_client: redis.Redis) -> BroadcastChannel:
        return create_broadcast_channel(redis_client, "sharded", key_prefix=KEY_PREFIX)

    def _shard_subscribers(self, channel: str) -> int:
        client: Any = self.shared_redis  # redis-py leaves execute_command untyped
        reply = client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
        counts = dict(zip(reply[::2], reply[1::2], strict=True)) if isinstance(reply, list) else dict(reply)
        return int(counts[channel.encode()])

    def test_uses_shard_channels_not_global_ones(self) -> None:
        name = unique_name()
        channel = f"{KEY_PREFIX}{name}"
        topic = self.make_channel().topic(name)
        with topic.subscribe() as subscription:
            assert self._shard_subscribers(channel) == 1
            # Global and shard channels are separate namespaces in Redis 7.
            self.shared_redis.publish(channel, b"global")
            self.shared_redis.spublish(channel, b"sharded")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"sharded"
            assert subscription.receive(timeout=0.2) is None
        wait_until(
            lambda: self._shard_subscribers(channel) == 0, ARRIVAL_DEADLINE, what="the server to drop the subscription"
        )
