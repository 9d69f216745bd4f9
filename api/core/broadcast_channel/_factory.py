"""Choosing a broadcast-channel variant by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from ._channel import BroadcastChannel

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["BroadcastChannelKind", "create_broadcast_channel"]

BroadcastChannelKind = Literal["pubsub", "sharded", "streams"]


def create_broadcast_channel(
    redis_client: Redis,
    kind: BroadcastChannelKind,
    *,
    key_prefix: str = "",
    stream_maxlen: int = 1000,
    stream_ttl_seconds: int = 600,
) -> BroadcastChannel:
    """Return a broadcast channel of the given ``kind`` on ``redis_client``.

    ``redis_client`` is a ``redis.Redis`` created with ``decode_responses=False``; the channel borrows
    connections from its pool (one per open subscription) and uses its retry policy for publishing.
    Channel and key names are ``key_prefix + topic name``. ``stream_maxlen`` (approximate) and
    ``stream_ttl_seconds`` (counted from a topic's last publish) bound each topic's stream and only
    apply to ``kind="streams"``. No I/O happens here.

    Raises:
        ValueError: ``kind`` is unknown, a stream bound is not a positive int, or the client decodes
            responses.
    """
    if kind == "pubsub":
        from .redis._pubsub import RedisPubSubChannel

        return RedisPubSubChannel(redis_client, key_prefix=key_prefix)
    if kind == "sharded":
        from .redis._sharded import RedisShardedChannel

        return RedisShardedChannel(redis_client, key_prefix=key_prefix)
    if kind == "streams":
        from .redis._streams import RedisStreamsChannel

        return RedisStreamsChannel(
            redis_client, key_prefix=key_prefix, maxlen=stream_maxlen, ttl_seconds=stream_ttl_seconds
        )
    raise ValueError(f"unknown broadcast channel kind {kind!r}; expected one of {get_args(BroadcastChannelKind)}")
