"""Broadcast over Redis sharded pub/sub, ``SPUBLISH`` / ``SSUBSCRIBE`` (Redis 7+).

Capability card:

- **Delivery**: live-only, at-most-once. A payload reaches the subscriptions whose ``SSUBSCRIBE``
  the server had confirmed when it ran the ``SPUBLISH``, and nobody else. Nothing is stored. In a
  cluster the message stays on the shard owning the channel's slot instead of being broadcast to
  every node; on a single Redis 7 server it behaves like plain pub/sub.
- **Ordering**: payloads from one producer arrive in publish order; producers interleave freely.
- **Disconnect**: a subscription never reconnects on its own. When its connection breaks (server
  down, slot migration or failover, the server dropping a slow consumer), ``receive`` raises
  ``BroadcastChannelUnavailableError`` and the subscription is closed. Payloads published meanwhile
  are lost; the caller re-subscribes. ``publish`` retries as the caller's client is configured to,
  then raises the same error.
- **Cost**: one server connection per open subscription, read in 50 ms slices by the thread
  calling ``receive``.
- **Scope**: verified with a ``redis.Redis`` client against a single server; a ``RedisCluster``
  client is not supported by this package yet.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from .._channel import Topic
from ._common import RedisTopic, check_client, redis_errors_translated, topic_key
from ._pubsub import ChannelSubscription

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["RedisShardedChannel"]


class RedisShardedChannel:
    """Topics are Redis shard channels named ``key_prefix + name`` (use a ``{hash tag}`` to pick the slot)."""

    def __init__(self, client: Redis, *, key_prefix: str = "") -> None:
        check_client(client)
        self._client = client
        self._key_prefix = key_prefix

    def topic(self, name: str) -> Topic:
        channel = topic_key(self._key_prefix, name)
        return RedisTopic(
            f"shard channel {channel!r}",
            functools.partial(self._publish, channel),
            functools.partial(ChannelSubscription, self._client, channel, sharded=True),
        )

    def _publish(self, channel: str, payload: bytes) -> None:
        with redis_errors_translated(f"SPUBLISH to {channel!r}"):
            self._client.spublish(channel, payload)
