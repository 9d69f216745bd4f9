"""The broadcast-channel contract on capped, expiring Redis streams, plus what is specific to them."""

from __future__ import annotations

import pytest
import redis

from api.core.broadcast_channel import (
    BroadcastChannel,
    BroadcastChannelUnavailableError,
    create_broadcast_channel,
)
from harness.waiting import wait_until

from .contract import (
    ARRIVAL_DEADLINE,
    KEY_PREFIX,
    BroadcastChannelContract,
    assert_enter_race,
    receive_n,
    unique_name,
)

# Short enough that anything a test leaves behind on the shared server disappears on its own.
TEST_TTL_SECONDS = 60


class TestRedisStreams(BroadcastChannelContract):
    def make_channel(self) -> BroadcastChannel:
        return self.make_channel_on(self.shared_redis)

    def make_channel_on(self, redis_client: redis.Redis, **options: int) -> BroadcastChannel:
        options.setdefault("stream_ttl_seconds", TEST_TTL_SECONDS)
        return create_broadcast_channel(redis_client, "streams", key_prefix=KEY_PREFIX, **options)

    def test_enter_race_with_and_without_an_existing_stream(self) -> None:
        # Even iterations subscribe before the key exists (start at 0-0), odd ones to a populated
        # stream (start at its last-generated-id); either way nothing after __enter__ is lost.
        assert_enter_race(self.make_channel(), 100, prefill=lambda iteration: 3 * (iteration % 2))

    def test_stream_is_trimmed_and_carries_a_ttl(self) -> None:
        maxlen = 10
        name = unique_name()
        key = f"{KEY_PREFIX}{name}"
        topic = self.make_channel_on(self.shared_redis, stream_maxlen=maxlen).topic(name)
        for seq in range(1000):
            topic.publish(b"%d" % seq)
        # MAXLEN ~ trims whole radix-tree nodes, so up to one node's worth beyond maxlen may stay.
        node_entries = int(str(self.shared_redis.config_get("stream-node-max-entries")["stream-node-max-entries"]))
        assert self.shared_redis.xlen(key) <= maxlen + node_entries
        assert 0 < self.shared_redis.ttl(key) <= TEST_TTL_SECONDS

    def test_stream_expires_after_its_last_publish_and_subscriptions_carry_on(self) -> None:
        name = unique_name()
        key = f"{KEY_PREFIX}{name}"
        topic = self.make_channel_on(self.shared_redis, stream_ttl_seconds=1).topic(name)
        with topic.subscribe() as subscription:
            topic.publish(b"before-expiry")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"before-expiry"
            wait_until(lambda: not self.shared_redis.exists(key), 5, what="the stream to expire")
            # The recreated stream's IDs are newer than the subscription's position.
            topic.publish(b"after-expiry")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"after-expiry"

    def test_entries_are_plain_stream_entries(self) -> None:
        name = unique_name()
        key = f"{KEY_PREFIX}{name}"
        topic = self.make_channel().topic(name)
        with topic.subscribe() as subscription:
            topic.publish(b"from-package")
            self.shared_redis.xadd(key, {b"data": b"from-outside"})
            self.shared_redis.xadd(key, {b"other": b"not a payload"})  # skipped: no payload field
            self.shared_redis.xadd(key, {b"data": b"last"})
            assert receive_n(subscription, 3) == [b"from-package", b"from-outside", b"last"]
        assert [fields for _, fields in self.shared_redis.xrange(key, count=1) or []] == [{b"data": b"from-package"}]

    def test_a_key_that_is_not_a_stream_is_reported_as_unavailable(self) -> None:
        name = unique_name()
        key = f"{KEY_PREFIX}{name}"
        self.shared_redis.set(key, b"not a stream", ex=TEST_TTL_SECONDS)
        topic = self.make_channel().topic(name)
        with pytest.raises(BroadcastChannelUnavailableError) as failure:
            topic.subscribe().__enter__()
        assert isinstance(failure.value.__cause__, redis.ResponseError)
        with pytest.raises(BroadcastChannelUnavailableError):
            topic.publish(b"x")

    def test_stream_bounds_are_validated(self) -> None:
        for options in ({"stream_maxlen": 0}, {"stream_ttl_seconds": 0}, {"stream_maxlen": -5}):
            with pytest.raises(ValueError):
                self.make_channel_on(self.shared_redis, **options)
