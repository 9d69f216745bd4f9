"""Broadcast over Redis ``PUBLISH`` / ``SUBSCRIBE``.

Capability card:

- **Delivery**: live-only, at-most-once. A payload reaches the subscriptions whose ``SUBSCRIBE`` the
  server had confirmed when it ran the ``PUBLISH``, and nobody else. Nothing is stored.
- **Ordering**: payloads from one producer arrive in publish order; producers interleave freely.
- **Disconnect**: a subscription never reconnects on its own. When its connection breaks (server
  down, failover, the server dropping a slow consumer at ``client-output-buffer-limit pubsub``),
  ``receive`` raises ``BroadcastChannelUnavailableError`` and the subscription is closed. Payloads
  published meanwhile are lost; the caller re-subscribes and resynchronises from its own state.
  ``publish`` retries as the caller's client is configured to, then raises the same error.
- **Cost**: one server connection per open subscription, read in 50 ms slices by the thread
  calling ``receive``. Payloads wait in the socket buffers until they are read.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any

from .._channel import Topic
from ._common import (
    NoRetryLease,
    PollingSubscription,
    RedisTopic,
    check_client,
    redis_errors_translated,
    topic_key,
)

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["ChannelSubscription", "RedisPubSubChannel"]


class RedisPubSubChannel:
    """Topics are Redis pub/sub channels named ``key_prefix + name``."""

    _sharded = False
    _kind = "pubsub channel"

    def __init__(self, client: Redis, *, key_prefix: str = "") -> None:
        check_client(client)
        self._client = client
        self._key_prefix = key_prefix

    def topic(self, name: str) -> Topic:
        channel = topic_key(self._key_prefix, name)
        return RedisTopic(
            f"{self._kind} {channel!r}",
            functools.partial(self._publish, channel),
            functools.partial(ChannelSubscription, self._client, channel, sharded=self._sharded),
        )

    def _publish(self, channel: str, payload: bytes) -> None:
        command = "SPUBLISH" if self._sharded else "PUBLISH"
        with redis_errors_translated(f"{command} to {channel!r}"):
            if self._sharded:
                self._client.spublish(channel, payload)
            else:
                self._client.publish(channel, payload)


def _release_pubsub(pubsub: Any, lease: NoRetryLease) -> None:
    # Restore first: closing the pub/sub hands its connection back to the caller's pool.
    lease.restore()
    with contextlib.suppress(Exception):
        pubsub.close()


class ChannelSubscription(PollingSubscription):
    """One ``SUBSCRIBE`` (or, with ``sharded``, ``SSUBSCRIBE``) on a connection of its own."""

    def __init__(self, client: Redis, channel: str, *, sharded: bool) -> None:
        super().__init__(f"{'sharded ' if sharded else ''}subscription to {channel!r}")
        self._client = client
        self._channel = channel
        self._sharded = sharded
        self._confirmation = "ssubscribe" if sharded else "subscribe"
        self._message = "smessage" if sharded else "message"
        self._pubsub: Any = None

    def _open(self) -> None:
        client: Any = self._client  # redis-py leaves Redis.pubsub() untyped
        pubsub = client.pubsub()
        lease = NoRetryLease()
        self._own(_release_pubsub, pubsub, lease)
        self._pubsub = pubsub
        if self._sharded:
            pubsub.ssubscribe(self._channel)
        else:
            pubsub.subscribe(self._channel)
        lease.apply(pubsub.connection)

    def _established(self, timeout: float) -> bool:
        # The server answers SUBSCRIBE before it sends any message of the channel, and a PUBLISH it
        # runs after answering reaches us; returning from __enter__ before this reply would let a
        # publish that follows __enter__ overtake the subscription.
        message = self._pubsub.get_message(timeout=timeout)
        return message is not None and message["type"] == self._confirmation

    def _poll(self, timeout: float) -> bytes | None:
        message = self._pubsub.get_message(timeout=timeout)
        if message is None or message["type"] != self._message:
            return None
        data = message["data"]
        return data if isinstance(data, bytes) else None
