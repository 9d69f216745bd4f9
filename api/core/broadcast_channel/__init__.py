"""Live-only broadcast channels: the event transport the app used before durable streams.

A payload published to a topic reaches the subscriptions open on it at that moment, and nobody
else; nothing is retained or replayed. A rollout flag chooses between this and the durable stream::

    from api.core.broadcast_channel import create_broadcast_channel

    channel = create_broadcast_channel(redis_client, "pubsub", key_prefix="workflow:")
    topic = channel.topic(f"run:{run_id}")
    with topic.subscribe() as subscription:
        for payload in subscription:
            ...
    # elsewhere, in a worker:
    topic.as_producer().publish(b'{"event": "node_finished"}')

The contract is in :mod:`._channel`; the Redis variants (``pubsub``, ``sharded``, ``streams``) each
open with a capability card. This package is a library: it receives a ``redis.Redis`` client and
knows nothing of the app.
"""

from __future__ import annotations

from ._channel import (
    BroadcastChannel,
    BroadcastChannelError,
    BroadcastChannelUnavailableError,
    Producer,
    Subscriber,
    Subscription,
    SubscriptionClosedError,
    Topic,
)
from ._factory import create_broadcast_channel

__all__ = [
    "BroadcastChannel",
    "BroadcastChannelError",
    "BroadcastChannelUnavailableError",
    "Producer",
    "Subscriber",
    "Subscription",
    "SubscriptionClosedError",
    "Topic",
    "create_broadcast_channel",
]
