"""The contract every broadcast-channel variant must meet, as a reusable test base class.

A variant's test module subclasses :class:`BroadcastChannelContract` and implements the two hooks.
Everything runs against real Redis servers: the shared one at 127.0.0.1:6379 for the behaviour
tests, and a private ``redis-server`` (from :mod:`harness.redis_server`) that the outage
test kills. Every test uses fresh uuid topic names, and waits with deadlines rather than sleeps.
"""

from __future__ import annotations

import functools
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from api.core.broadcast_channel import (
    BroadcastChannel,
    BroadcastChannelError,
    BroadcastChannelUnavailableError,
    Producer,
    Subscriber,
    Subscription,
    SubscriptionClosedError,
    Topic,
)
from harness.redis_server import RedisServer, redis_available
from harness.services import REDIS_HOST, REDIS_PORT
from harness.waiting import wait_until

__all__ = [
    "KEY_PREFIX",
    "SHARED_REDIS_HOST",
    "SHARED_REDIS_PORT",
    "Background",
    "BroadcastChannelContract",
    "assert_enter_race",
    "receive_n",
    "unique_name",
    "wait_until",
]

SHARED_REDIS_HOST = REDIS_HOST
SHARED_REDIS_PORT = REDIS_PORT
# One prefix per run keeps this suite's channels and keys apart from anyone else's on the shared server.
KEY_PREFIX = f"bctest-{uuid.uuid4().hex[:8]}:"

# Generous bounds for "it arrives": a loaded CI box or gevent's single thread can be slow, and a
# deadline only costs time when the test is failing anyway.
ARRIVAL_DEADLINE = 10.0
CLOSE_UNBLOCK_BOUND = 0.1
OUTAGE_BOUND = 2.0


def unique_name() -> str:
    return f"topic-{uuid.uuid4().hex}"


def receive_n(subscription: Subscription, count: int, timeout: float = ARRIVAL_DEADLINE) -> list[bytes]:
    """Receive exactly ``count`` payloads, failing if they have not all arrived by the deadline."""
    deadline = time.monotonic() + timeout
    received: list[bytes] = []
    while len(received) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"received {len(received)} of {count} payloads within {timeout} s")
        payload = subscription.receive(timeout=min(remaining, 1.0))
        if payload is not None:
            received.append(payload)
    return received


def receive_until(subscription: Subscription, last: bytes, timeout: float = ARRIVAL_DEADLINE) -> list[bytes]:
    """Receive payloads up to and including ``last``."""
    deadline = time.monotonic() + timeout
    received: list[bytes] = []
    while not received or received[-1] != last:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"{last!r} did not arrive within {timeout} s; got {len(received)} payloads before it")
        payload = subscription.receive(timeout=min(remaining, 1.0))
        if payload is not None:
            received.append(payload)
    return received


class Background[T]:
    """Runs ``fn`` in a thread (a greenlet under gevent) and records how and when it ended."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self.started = threading.Event()
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.finished_at = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.started.set()
        try:
            self.result = self._fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished_at = time.monotonic()
            self.done.set()

    def join(self, timeout: float = ARRIVAL_DEADLINE) -> T | None:
        assert self.done.wait(timeout), f"background call did not finish within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result


def assert_enter_race(
    channel: BroadcastChannel, iterations: int, *, prefill: Callable[[int], int] | None = None
) -> None:
    """Subscribe ``iterations`` times while another thread publishes without pause.

    Each time: everything whose publish *started* after ``__enter__`` returned must arrive, nothing
    whose publish *finished* before ``__enter__`` was called may arrive, and what arrives is one
    gap-free run in publish order. ``prefill(i)`` payloads are published before the race starts,
    so the topic's state at ``__enter__`` can vary (for streams: no key yet, or a populated one).
    """
    for iteration in range(iterations):
        _race_once(channel, iteration, prefill(iteration) if prefill is not None else 0)


def _race_once(channel: BroadcastChannel, iteration: int, prefill: int) -> None:
    topic = channel.topic(unique_name())
    for _ in range(prefill):
        topic.publish(b"stale")
    stop = threading.Event()
    log: list[tuple[int, float, float]] = []

    def publish_forever() -> None:
        seq = 0
        while not stop.is_set():
            started = time.monotonic()
            topic.publish(b"seq:%d" % seq)
            log.append((seq, started, time.monotonic()))
            seq += 1

    publisher = Background(publish_forever)
    try:
        wait_until(lambda: len(log) >= 3, ARRIVAL_DEADLINE, what="the publisher to get going")
        subscription = topic.subscribe()
        before_enter = time.monotonic()
        subscription.__enter__()
        entered = time.monotonic()
        try:
            topic.publish(b"marker")
            received = receive_until(subscription, b"marker")
            stop.set()
            publisher.join()
            topic.publish(b"end")
            received += receive_until(subscription, b"end")
        finally:
            subscription.close()
    finally:
        stop.set()
        publisher.join()

    assert b"stale" not in received, f"iteration {iteration}: a payload from before the race was replayed"
    seqs = [int(payload.split(b":")[1]) for payload in received if payload.startswith(b"seq:")]
    must_arrive = {seq for seq, started, _ in log if started > entered}
    must_not_arrive = {seq for seq, _, finished in log if finished < before_enter}
    assert must_arrive <= set(seqs), f"iteration {iteration}: lost {sorted(must_arrive - set(seqs))[:5]}"
    assert not must_not_arrive & set(seqs), f"iteration {iteration}: replayed {sorted(must_not_arrive & set(seqs))[:5]}"
    if seqs:
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), f"iteration {iteration}: gap or reorder in {seqs[:20]}"


class BroadcastChannelContract:
    """Behaviour every variant shares. Subclass it in a ``test_*.py`` module and implement the hooks."""

    shared_redis: redis.Redis

    # -- hooks -------------------------------------------------------------------------------------

    def make_channel(self) -> BroadcastChannel:
        """A channel on the shared server; ``self.shared_redis`` is a client for it."""
        raise NotImplementedError

    def make_channel_on(self, redis_client: redis.Redis) -> BroadcastChannel:
        """A channel of the same variant on ``redis_client`` (used for the private, killable server)."""
        raise NotImplementedError

    # -- fixtures ----------------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _shared_redis(self) -> Iterator[None]:
        client = redis.Redis(host=SHARED_REDIS_HOST, port=SHARED_REDIS_PORT)
        try:
            client.ping()
        except redis.ConnectionError as exc:
            pytest.fail(f"the broadcast-channel suite needs Redis at {SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}: {exc}")
        self.shared_redis = client
        yield
        # Every subscription a test opened is closed by now, so each borrowed connection is back.
        # The pool's own sets: get_connection_count() exists only from redis-py 7 on.
        pool = client.connection_pool
        free, in_use = len(pool._available_connections), len(pool._in_use_connections)
        client.close()
        assert in_use == 0, f"{in_use} pooled connection(s) still in use after the test ({free} free)"

    # -- delivery ----------------------------------------------------------------------------------

    def test_protocols_are_implemented(self) -> None:
        topic = self.make_channel().topic(unique_name())
        assert isinstance(self.make_channel(), BroadcastChannel)
        assert isinstance(topic, Topic)
        assert isinstance(topic.as_producer(), Producer)
        assert isinstance(topic.as_subscriber(), Subscriber)
        assert isinstance(topic.subscribe(), Subscription)

    def test_message_published_after_enter_is_received(self) -> None:
        topic = self.make_channel().topic(unique_name())
        with topic.subscribe() as subscription:
            topic.publish(b"hello")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"hello"

    def test_messages_published_before_subscribing_are_not_received(self) -> None:
        topic = self.make_channel().topic(unique_name())
        topic.publish(b"early-1")
        topic.publish(b"early-2")
        with topic.subscribe() as subscription:
            topic.publish(b"late")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"late"
            assert subscription.receive(timeout=0.2) is None

    def test_two_subscriptions_both_receive_every_message_in_publish_order(self) -> None:
        topic = self.make_channel().topic(unique_name())
        payloads = [b"m%d" % i for i in range(50)]
        with topic.subscribe() as first, topic.subscribe() as second:
            for payload in payloads:
                topic.publish(payload)
            assert receive_n(first, len(payloads)) == payloads
            assert receive_n(second, len(payloads)) == payloads

    def test_topics_are_isolated(self) -> None:
        channel = self.make_channel()
        left, right = channel.topic(unique_name()), channel.topic(unique_name())
        with left.subscribe() as left_sub, right.subscribe() as right_sub:
            left.publish(b"for-left")
            right.publish(b"for-right")
            assert left_sub.receive(timeout=ARRIVAL_DEADLINE) == b"for-left"
            assert right_sub.receive(timeout=ARRIVAL_DEADLINE) == b"for-right"
            assert left_sub.receive(timeout=0.2) is None
            assert right_sub.receive(timeout=0) is None

    def test_binary_payloads_are_preserved(self) -> None:
        rng = random.Random(7)
        payloads = [
            b"",
            b"\x00",
            bytes(range(256)),
            b"*3\r\n$3\r\nSET\r\n",  # looks like RESP on the wire
            "ünïcødé ✓".encode(),
            rng.randbytes(256 * 1024),
        ]
        topic = self.make_channel().topic(unique_name())
        with topic.subscribe() as subscription:
            for payload in payloads:
                topic.publish(payload)
            assert receive_n(subscription, len(payloads)) == payloads

    def test_resp3_clients_work(self) -> None:
        # RESP3 changes the reply shapes redis-py hands back (push messages, maps instead of arrays).
        client = redis.Redis(host=SHARED_REDIS_HOST, port=SHARED_REDIS_PORT, protocol=3)
        try:
            topic = self.make_channel_on(client).topic(unique_name())
            with topic.subscribe() as subscription:
                payloads = [b"\x00\xff", b"", b"resp3"]
                for payload in payloads:
                    topic.publish(payload)
                assert receive_n(subscription, len(payloads)) == payloads
        finally:
            client.close()

    def test_concurrent_producers_all_arrive_in_per_producer_order(self) -> None:
        producers, per_producer = 4, 200
        topic = self.make_channel().topic(unique_name())
        with topic.subscribe() as subscription:
            go = threading.Event()

            def produce(producer: int) -> None:
                view = topic.as_producer()
                assert go.wait(ARRIVAL_DEADLINE)
                for seq in range(per_producer):
                    view.publish(b"%d:%d" % (producer, seq))

            workers = [Background(functools.partial(produce, p)) for p in range(producers)]
            go.set()
            received = receive_n(subscription, producers * per_producer, timeout=30)
            for worker in workers:
                worker.join()
            assert subscription.receive(timeout=0.1) is None
        by_producer: dict[int, list[int]] = {}
        for payload in received:
            producer, seq = (int(part) for part in payload.split(b":"))
            by_producer.setdefault(producer, []).append(seq)
        assert by_producer == {p: list(range(per_producer)) for p in range(producers)}

    def test_concurrent_receivers_share_one_subscription_without_duplicates(self) -> None:
        topic = self.make_channel().topic(unique_name())
        total = 300
        with topic.subscribe() as subscription:
            collected: list[list[bytes]] = [[], []]

            def drain(into: list[bytes]) -> None:
                while True:
                    try:
                        payload = subscription.receive(timeout=None)
                    except SubscriptionClosedError:
                        return
                    if payload is not None:
                        into.append(payload)

            readers = [Background(functools.partial(drain, into)) for into in collected]
            for seq in range(total):
                topic.publish(b"%d" % seq)
            wait_until(lambda: sum(map(len, collected)) >= total, ARRIVAL_DEADLINE, what="all payloads to be received")
            subscription.close()
            for reader in readers:
                reader.join()
        everything = sorted(int(payload) for part in collected for payload in part)
        assert everything == list(range(total))
        for part in collected:
            assert [int(p) for p in part] == sorted(int(p) for p in part)

    def test_producer_and_subscriber_views(self) -> None:
        topic = self.make_channel().topic(unique_name())
        producer, subscriber = topic.as_producer(), topic.as_subscriber()
        assert not hasattr(producer, "subscribe")
        assert not hasattr(subscriber, "publish")
        with subscriber.subscribe() as subscription:
            producer.publish(b"via-view")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"via-view"

    def test_the_same_name_gives_the_same_topic(self) -> None:
        channel = self.make_channel()
        name = unique_name()
        with channel.topic(name).subscribe() as subscription:
            channel.topic(name).publish(b"same")
            assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"same"

    def test_subscribe_after_enter_race(self) -> None:
        assert_enter_race(self.make_channel(), 20)

    # -- timing and closing --------------------------------------------------------------------------

    def test_receive_returns_none_on_timeout(self) -> None:
        topic = self.make_channel().topic(unique_name())
        with topic.subscribe() as subscription:
            timeout = 0.3
            started = time.monotonic()
            assert subscription.receive(timeout=timeout) is None
            elapsed = time.monotonic() - started
            # Its own timeout: a receive that took it for another (or none) would be far off.
            assert 0.95 * timeout <= elapsed < 5 * timeout, elapsed

            # timeout=0 does not wait: twenty of them take less than the one default wait (0.1 s) each
            # would take if it were read as "the default".
            started = time.monotonic()
            for _ in range(20):
                assert subscription.receive(timeout=0) is None
            assert time.monotonic() - started < 20 * 0.1 / 2

            started = time.monotonic()
            assert subscription.receive() is None  # the default timeout is 0.1 s
            assert 0.09 <= time.monotonic() - started < 10 * 0.1

    def test_close_from_another_thread_unblocks_receive(self) -> None:
        topic = self.make_channel().topic(unique_name())
        subscription = topic.subscribe().__enter__()
        receiver = Background(lambda: subscription.receive(timeout=30))
        assert receiver.started.wait(ARRIVAL_DEADLINE)
        # Not a pause for synchronisation: it checks the receiver really is blocked before closing.
        assert not receiver.done.wait(0.25), "receive(timeout=30) returned without a message"
        closed_at = time.monotonic()
        subscription.close()
        assert receiver.done.wait(ARRIVAL_DEADLINE)
        assert isinstance(receiver.error, SubscriptionClosedError), receiver.error
        assert receiver.finished_at - closed_at < CLOSE_UNBLOCK_BOUND, receiver.finished_at - closed_at
        with pytest.raises(SubscriptionClosedError):
            subscription.receive(timeout=0)
        with pytest.raises(SubscriptionClosedError):
            subscription.receive(timeout=1)

    def test_close_is_idempotent_and_final(self) -> None:
        topic = self.make_channel().topic(unique_name())
        never_entered = topic.subscribe()
        never_entered.close()
        never_entered.close()
        with pytest.raises(SubscriptionClosedError):
            never_entered.__enter__()

        with topic.subscribe() as subscription:
            subscription.close()
            subscription.close()
            topic.publish(b"after-close")
            with pytest.raises(SubscriptionClosedError):
                subscription.receive(timeout=0.1)
        subscription.close()
        with pytest.raises(SubscriptionClosedError):
            subscription.__enter__()

    def test_misuse_is_reported(self) -> None:
        channel = self.make_channel()
        topic = channel.topic(unique_name())
        with pytest.raises(RuntimeError):
            topic.subscribe().receive(timeout=0)
        with topic.subscribe() as subscription, pytest.raises(RuntimeError):
            subscription.__enter__()
        with pytest.raises(TypeError):
            topic.publish("text")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            channel.topic("")
        with pytest.raises(ValueError):
            self.make_channel_on(redis.Redis(host=SHARED_REDIS_HOST, port=SHARED_REDIS_PORT, decode_responses=True))

    def test_iteration_stops_after_close(self) -> None:
        topic = self.make_channel().topic(unique_name())
        with topic.subscribe() as subscription:
            for payload in (b"a", b"b", b"c"):
                topic.publish(payload)
            seen: list[bytes] = []
            for payload in subscription:
                seen.append(payload)
                if len(seen) == 3:
                    subscription.close()
            assert seen == [b"a", b"b", b"c"]

        with topic.subscribe() as subscription:
            iterated: list[bytes] = []
            iterator = Background(lambda: iterated.extend(subscription))
            topic.publish(b"x")
            wait_until(lambda: iterated == [b"x"], ARRIVAL_DEADLINE, what="the iterating thread to receive")
            closed_at = time.monotonic()
            subscription.close()
            iterator.join()
            assert iterator.finished_at - closed_at < CLOSE_UNBLOCK_BOUND

    # -- outages -------------------------------------------------------------------------------------

    def test_dead_server_raises_unavailable_not_redis_errors(self) -> None:
        if not redis_available():
            pytest.skip("redis-server is not installed")
        with RedisServer() as server:
            # The subscribing client keeps redis-py's default (slow, retrying) policy: the channel
            # itself must notice the outage within the bound. Publishing honours the caller's
            # policy, so the publishing client fails fast to keep the test short.
            subscribing = redis.Redis(host="127.0.0.1", port=server.port)
            publishing = redis.Redis(host="127.0.0.1", port=server.port, retry=Retry(NoBackoff(), 1))
            try:
                name = unique_name()
                producer = self.make_channel_on(publishing).topic(name)
                subscription = self.make_channel_on(subscribing).topic(name).subscribe().__enter__()
                producer.publish(b"alive")
                assert subscription.receive(timeout=ARRIVAL_DEADLINE) == b"alive"

                receiver = Background(lambda: subscription.receive(timeout=30))
                assert receiver.started.wait(ARRIVAL_DEADLINE)
                assert not receiver.done.wait(0.1), "receive(timeout=30) returned without a message"
                killed_at = time.monotonic()
                server.kill()
                assert receiver.done.wait(OUTAGE_BOUND + 5), "a blocked receive never noticed the dead server"
                assert isinstance(receiver.error, BroadcastChannelUnavailableError | SubscriptionClosedError), repr(
                    receiver.error
                )
                assert receiver.finished_at - killed_at < OUTAGE_BOUND, receiver.finished_at - killed_at
                # The failure closed the subscription: nothing can come through it any more.
                with pytest.raises(SubscriptionClosedError):
                    subscription.receive(timeout=0)
                subscription.close()

                with pytest.raises(BroadcastChannelUnavailableError) as publish_failure:
                    producer.publish(b"lost")
                assert isinstance(publish_failure.value.__cause__, redis.RedisError)
                with pytest.raises(BroadcastChannelUnavailableError):
                    self.make_channel_on(publishing).topic(name).subscribe().__enter__()
            finally:
                subscribing.close()
                publishing.close()

    def test_errors_share_a_base_class(self) -> None:
        assert issubclass(SubscriptionClosedError, BroadcastChannelError)
        assert issubclass(BroadcastChannelUnavailableError, BroadcastChannelError)
        assert not issubclass(BroadcastChannelUnavailableError, redis.RedisError)
