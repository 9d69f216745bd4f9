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

from ._pubsub import RedisPubSubChannel

__all__ = ["RedisShardedChannel"]


class RedisShardedChannel(RedisPubSubChannel):
    """Topics are Redis shard channels named ``key_prefix + name`` (use a ``{hash tag}`` to pick the slot)."""

    _sharded = True
    _kind = "shard channel"
