"""Redis adapter benchmarks against the raw redis-py loops doing the same work.

Run with ``.venv/bin/python -m bench.redis`` (``make bench``). By default a private ``redis-server``
is started on a free loopback port so nothing else touches it; ``--url redis://host:port/db`` uses an
existing server instead. Both sides of every comparison run in one process run against the same
server. A table is printed and the figures are written to ``bench/results/redis-<date>.json``.

Workloads (the targets come from the adapter's issue):

- ``append``: ``topic.append()`` rate vs a raw ``XADD`` round-trip loop, one thread, 200-byte payloads
  (target ≥ 0.8x).
- ``latency``: append → ``receive()`` p50/p99 with the producer in another process (as a Celery
  worker appends for an API worker) vs a raw blocking ``XREAD`` consumer thread fed by a raw
  ``XADD`` process (target ≤ 1.5x); the same with both consumers under gevent (as in the app's API
  workers), and with the producer as a thread of the consumer's process, are reported beside it.
- ``catchup``: draining 100,000 retained records through one subscription vs a raw
  ``XREAD COUNT 500`` drain (target ≥ 0.3x).
- ``fanout``: 10,000 subscriptions on 1,000 topics in one gevent process, 2,000 appends/s in total from
  another process for 30 s: p99 append → receive (target ≤ 50 ms) and RSS per subscription, measured
  after a 1 s warm-up in which every subscription starts waiting, ended by one full GC collection;
  ``fanout_gc_frozen`` the same with ``gc.freeze()`` in the consumer after the warm-up (the target
  is judged on ``fanout``).
- ``broadcast``, ``broadcast_fanout``: the same append, latency and fan-out workloads on the app's
  broadcast channel (``create_broadcast_channel(client, "streams")``), for comparison. Catch-up does
  not apply to it (live-only).

``FANOUT_DEBUG=<ms>`` makes the fan-out consumer print, per 100 ms of the run, how many deliveries were
slower than that, to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import cpu_model, percentile

PAYLOAD_SIZE = 200
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _payload(stamp_ns: int) -> bytes:
    return struct.pack(">q", stamp_ns).ljust(PAYLOAD_SIZE, b"x")


def _stamp(payload: bytes) -> int:
    return int(struct.unpack_from(">q", payload)[0])


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    sys.path.insert(0, str(ROOT))
    from harness.redis_server import RedisServer

    # Room for the broadcast channel's fan-out, which holds one connection per subscription.
    with RedisServer(extra=["--maxclients", "15000"]) as server:
        yield server.url


def _raw(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, protocol=2)


def _subscribed(client: Any, prefix: str, names: list[str]) -> int:
    """How many of the topics' hint channels have a subscriber (the backend's change feed), per the server."""
    from api.core.durable_stream.adapters.redis.scripts import topic_keys

    channels = [topic_keys(prefix, name)[2] for name in names]
    reply = client.execute_command("PUBSUB", "SHARDNUMSUB", *channels)
    return sum(1 for count in reply[1::2] if int(count) > 0)


def _feed_links(client: Any) -> int:
    """The change feed's connections to the server (client names end in ``:feed``)."""
    return sum(1 for entry in client.client_list() if str(entry.get("name", "")).endswith(":feed"))


# -- append -----------------------------------------------------------------------------------


def bench_append(url: str, count: int, rounds: int) -> dict[str, Any]:
    from api.core.durable_stream import connect

    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    ours: list[float] = []
    raw_rates: list[float] = []
    held: list[float] = []
    payload = b"x" * PAYLOAD_SIZE
    with connect(url, key_prefix=prefix) as backend:
        topic = backend.topic("append")
        client = _raw(url)
        raw_key = f"{prefix}raw-append"
        connection = client.connection_pool.get_connection()
        for _ in range(rounds):  # interleaved, so background noise hits both sides alike
            started = time.perf_counter()
            for _ in range(count):
                topic.append(payload)
            ours.append(count / (time.perf_counter() - started))
            started = time.perf_counter()
            for _ in range(count):
                client.xadd(raw_key, {"p": payload})
            raw_rates.append(count / (time.perf_counter() - started))
            started = time.perf_counter()
            for _ in range(count):
                connection.send_command("XADD", raw_key, "*", "p", payload)
                connection.read_response()
            held.append(count / (time.perf_counter() - started))
        client.connection_pool.release(connection)
        backend.admin.delete_topic("append")
        client.delete(raw_key)
        client.close()
    ours_rate, raw_rate = statistics.median(ours), statistics.median(raw_rates)
    return {
        "appends_per_round": count,
        "rounds": rounds,
        "ours_per_s": round(ours_rate),
        "raw_xadd_per_s": round(raw_rate),
        "raw_xadd_held_connection_per_s": round(statistics.median(held)),
        "ratio": round(ours_rate / raw_rate, 3),
        "ratio_vs_held_connection": round(ours_rate / statistics.median(held), 3),
        "target": ">= 0.8",
        "met": ours_rate / raw_rate >= 0.8,
    }


# -- latency ----------------------------------------------------------------------------------


def _paced(count: int, rate: float, send: Callable[[bytes], None]) -> None:
    interval = 1.0 / rate
    next_at = time.perf_counter()
    for _ in range(count):
        now = time.perf_counter()
        if next_at > now:
            time.sleep(next_at - now)
        send(_payload(time.perf_counter_ns()))
        next_at += interval


@contextlib.contextmanager
def _sender(url: str, kind: str, target: str, count: int, rate: float, remote: bool) -> Iterator[Callable[[], None]]:
    """Yield ``start()``: it sends ``count`` stamped payloads at ``rate`` and returns when all are sent.

    ``kind`` is ``ours`` (``target`` is a key prefix; the topic is ``latency``) or ``raw`` (``target``
    is a stream key). With ``remote`` the appends come from a child process, as from a Celery worker
    to an API worker; otherwise from a thread of this process, sharing its GIL with the consumer.
    """
    if remote:
        command = [
            sys.executable, "-m", "bench.redis", "--latency-producer", kind, "--url", url,
            "--prefix", target, "--count", str(count), "--rate", str(rate),
        ]  # fmt: skip
        child = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "ready"

            def start_remote() -> None:
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("go\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "done"

            yield start_remote
        finally:
            child.kill()
            child.wait(timeout=10)
        return
    with _send_function(url, kind, target) as send:
        yield lambda: _paced(count, rate, send)


@contextlib.contextmanager
def _send_function(url: str, kind: str, target: str) -> Iterator[Callable[[bytes], None]]:
    if kind == "raw":
        client = _raw(url)
        try:
            yield lambda payload: client.xadd(target, {"p": payload})
        finally:
            client.close()
        return
    from api.core.durable_stream import connect

    with connect(url, key_prefix=target) as producer:
        topic = producer.topic("latency")
        yield topic.append


def latency_producer(url: str, kind: str, target: str, count: int, rate: float) -> None:
    """The child process of :func:`_sender`."""
    with _send_function(url, kind, target) as send:
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        _paced(count, rate, send)
        print("done", flush=True)


def _latency_ours(
    url: str, count: int, rate: float, remote: bool, timings: list[tuple[int, int]] | None = None
) -> list[float]:
    """Latencies in ms; ``timings`` (if given) gets each record's ``(stamp, returned)`` in ns."""
    from api.core.durable_stream import CLOSED, connect

    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    name = "latency"
    samples: list[float] = []
    with connect(url, key_prefix=prefix) as consumer, _sender(url, "ours", prefix, count, rate, remote) as start:
        consumer.topic(name).append(_payload(0))  # a stream ID for the subscription to chain from
        with consumer.topic(name).subscribe_from_beginning() as subscription:
            subscription.receive(timeout=5)
            watcher = _raw(url)
            deadline = time.monotonic() + 10
            while not _subscribed(watcher, prefix, [name]) and time.monotonic() < deadline:
                time.sleep(0.01)
            watcher.close()

            def consume() -> None:
                while len(samples) < count:
                    result = subscription.receive(timeout=5)
                    if result is None or result is CLOSED:
                        return
                    returned, stamp = time.perf_counter_ns(), _stamp(result.payload)
                    samples.append((returned - stamp) / 1e6)
                    if timings is not None:
                        timings.append((stamp, returned))

            reader = threading.Thread(target=consume)
            reader.start()
            start()
            reader.join(timeout=60)
        consumer.admin.delete_topic(name)
    return samples


def _latency_raw(url: str, count: int, rate: float, remote: bool = False) -> list[float]:
    consumer = _raw(url)
    key = f"bench-raw-latency-{uuid.uuid4().hex[:8]}"
    start_id = consumer.xadd(key, {"p": _payload(0)})
    samples: list[float] = []

    def consume() -> None:
        last = start_id
        while len(samples) < count:
            reply = consumer.xread({key: last}, count=100, block=2000)
            if not reply:
                return
            for entry_id, fields in reply[0][1]:
                samples.append((time.perf_counter_ns() - _stamp(fields[b"p"])) / 1e6)
                last = entry_id

    with _sender(url, "raw", key, count, rate, remote) as start:
        reader = threading.Thread(target=consume)
        reader.start()
        time.sleep(0.05)
        start()
        reader.join(timeout=60)
    consumer.delete(key)
    consumer.close()
    return samples


def _latency_under_gevent(url: str, kind: str, count: int, rate: float) -> list[float]:
    """:func:`_latency_ours` or :func:`_latency_raw` (producer in another process) in a child process
    under gevent monkey-patching, as in a gevent API worker."""
    command = [
        sys.executable, "-m", "gevent.monkey", "--module", "bench.redis", "--latency-consumer", kind,
        "--url", url, "--count", str(count), "--rate", str(rate),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    samples: list[float] = json.loads(done.stdout.strip().splitlines()[-1])
    return samples


def latency_consumer(url: str, kind: str, count: int, rate: float) -> None:
    """The child process of :func:`_latency_under_gevent`."""
    samples = (_latency_ours if kind == "ours" else _latency_raw)(url, count, rate, True)
    print(json.dumps(samples), flush=True)


def bench_latency(url: str, count: int, rate: float, rounds: int) -> dict[str, Any]:
    """Three layouts, each against the raw loop in the same layout. The producer in another process
    (how the app runs: Celery workers append, API workers read) with the consumer in plain threads
    is the target's measurement; the same with the consumer under gevent (as in the app's API
    workers), and with the producer as a thread of the consumer's process, are reported beside it."""
    result: dict[str, Any] = {"rate_per_s": rate}
    met = True
    layouts: list[tuple[str, Callable[[], list[float]], Callable[[], list[float]]]] = [
        ("", lambda: _latency_ours(url, count, rate, True), lambda: _latency_raw(url, count, rate, True)),
        (
            "gevent_",
            lambda: _latency_under_gevent(url, "ours", count, rate),
            lambda: _latency_under_gevent(url, "raw", count, rate),
        ),
        (
            "same_process_",
            lambda: _latency_ours(url, count, rate, False),
            lambda: _latency_raw(url, count, rate, False),
        ),
    ]
    for layout, measure_ours, measure_raw in layouts:
        target_layout = layout == ""
        ours: list[float] = []
        raw: list[float] = []
        for _ in range(rounds):
            ours += measure_ours()
            raw += measure_raw()
        result[f"{layout}samples_each"] = len(ours)
        for name, fraction in (("p50", 0.5), ("p99", 0.99)):
            ours_ms, raw_ms = percentile(ours, fraction), percentile(raw, fraction)
            result[f"{layout}ours_{name}_ms"] = round(ours_ms, 3)
            result[f"{layout}raw_xread_{name}_ms"] = round(raw_ms, 3)
            result[f"{layout}{name}_ratio"] = round(ours_ms / raw_ms, 3)
            if target_layout:
                met = met and ours_ms <= 1.5 * raw_ms
    result["target"] = "<= 1.5x at p50 and p99 (producer in another process, consumer in threads)"
    result["met"] = met
    return result


# -- the broadcast channel's Redis Streams variant --------------------------------------------


def bench_broadcast(url: str, count: int, rounds: int, samples: int, rate: float) -> dict[str, Any]:
    """Publish rate and publish → receive latency of ``create_broadcast_channel(..., "streams")``.

    It has no retained history (a subscription starts after the stream's last entry), so the
    catch-up workload does not apply to it.
    """
    from api.core.broadcast_channel import create_broadcast_channel

    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    client = _raw(url)
    channel = create_broadcast_channel(client, "streams", key_prefix=prefix)
    payload = b"x" * PAYLOAD_SIZE
    publish_rates: list[float] = []
    raw_rates: list[float] = []
    topic = channel.topic("append")
    raw_key = f"{prefix}raw-append"
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(count):
            topic.publish(payload)
        publish_rates.append(count / (time.perf_counter() - started))
        started = time.perf_counter()
        for _ in range(count):
            client.xadd(raw_key, {"p": payload})
        raw_rates.append(count / (time.perf_counter() - started))
    latencies: list[float] = []
    raw_latencies: list[float] = []
    for _ in range(min(rounds, 2)):
        live = channel.topic(f"latency-{uuid.uuid4().hex[:6]}")
        received_at: list[float] = []
        with live.subscribe() as subscription:

            def consume(subscription: Any = subscription, into: list[float] = received_at) -> None:
                while len(into) < samples:
                    received = subscription.receive(timeout=5)
                    if received is None:
                        return
                    into.append((time.perf_counter_ns() - _stamp(received)) / 1e6)

            reader = threading.Thread(target=consume)
            reader.start()
            time.sleep(0.05)
            _paced(samples, rate, live.publish)
            reader.join(timeout=60)
        latencies += received_at
        raw_latencies += _latency_raw(url, samples, rate)
    client.delete(raw_key, f"{prefix}append")
    client.close()
    publish_rate, raw_rate = statistics.median(publish_rates), statistics.median(raw_rates)
    return {
        "publish_per_s": round(publish_rate),
        "raw_xadd_per_s": round(raw_rate),
        "publish_ratio": round(publish_rate / raw_rate, 3),
        "samples": len(latencies),
        "p50_ms": round(percentile(latencies, 0.5), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "raw_xread_p50_ms": round(percentile(raw_latencies, 0.5), 3),
        "raw_xread_p99_ms": round(percentile(raw_latencies, 0.99), 3),
        "catchup": "not applicable: live-only, nothing is retained for a new subscription",
    }


# -- catch-up ---------------------------------------------------------------------------------


def bench_catchup(url: str, count: int, buffer_sizes: list[int]) -> dict[str, Any]:
    from api.core.durable_stream import connect
    from api.core.durable_stream.adapters.redis.scripts import APPEND_SCRIPT, topic_keys

    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    client = _raw(url)
    result: dict[str, Any] = {"records": count}
    with connect(url, key_prefix=prefix) as backend:
        name = "catchup"
        keys = topic_keys(prefix, name)
        client.script_load(APPEND_SCRIPT.source)
        pipe = client.pipeline(transaction=False)
        for index in range(count):  # filled through the adapter's own append script, pipelined
            pipe.evalsha(
                APPEND_SCRIPT.sha, 3, *keys, b"%012d" % index + b"x" * (PAYLOAD_SIZE - 12), "e" * 16, 0, 0, "0"
            )
            if index % 2000 == 1999:
                pipe.execute()
        pipe.execute()
        raw_key = f"{prefix}raw-catchup"
        for start in range(0, count, 2000):
            pipe = client.pipeline(transaction=False)
            for index in range(start, min(count, start + 2000)):
                pipe.xadd(raw_key, {"p": b"%012d" % index + b"x" * (PAYLOAD_SIZE - 12)})
            pipe.execute()
        raw_rates = []
        ours_rates: dict[int, list[float]] = {size: [] for size in buffer_sizes}
        for _ in range(2):
            for size in buffer_sizes:
                with connect(url, key_prefix=prefix, buffer_size=size) as reader:
                    started = time.perf_counter()
                    with reader.topic(name).subscribe_from_beginning() as subscription:
                        for _ in range(count):
                            record = subscription.receive(timeout=10)
                            assert record is not None and not isinstance(record, type(None))
                    ours_rates[size].append(count / (time.perf_counter() - started))
            started = time.perf_counter()
            last, seen = b"0-0", 0
            while seen < count:
                reply = client.xread({raw_key: last}, count=500)
                entries = reply[0][1]
                seen += len(entries)
                last = entries[-1][0]
            raw_rates.append(count / (time.perf_counter() - started))
        backend.admin.delete_topic(name)
        client.delete(raw_key)
    client.close()
    raw_rate = statistics.median(raw_rates)
    result["raw_xread_count_500_per_s"] = round(raw_rate)
    met = True
    for size in buffer_sizes:
        rate = statistics.median(ours_rates[size])
        result[f"ours_buffer_{size}_per_s"] = round(rate)
        result[f"ratio_buffer_{size}"] = round(rate / raw_rate, 3)
        if size == buffer_sizes[0]:
            met = rate / raw_rate >= 0.3
    result["target"] = f">= 0.3 (default buffer_size {buffer_sizes[0]})"
    result["met"] = met
    return result


# -- fan-out ----------------------------------------------------------------------------------


def bench_fanout(
    url: str,
    topics: int,
    per_topic: int,
    rate: float,
    duration: float,
    poll_interval: float | None = None,
    variant: str = "durable",
    gc_freeze: bool = False,
) -> dict[str, Any]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    command = [
        sys.executable, "-m", "gevent.monkey", "--module", "bench.redis", "--fanout-consumer",
        "--url", url, "--prefix", prefix, "--topics", str(topics), "--per-topic", str(per_topic),
        "--duration", str(duration + 3), "--variant", variant,
    ]  # fmt: skip
    if poll_interval is not None:
        command += ["--poll-interval", str(poll_interval)]
    if gc_freeze:
        command.append("--gc-freeze")
    consumer = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert consumer.stdout is not None
    line = consumer.stdout.readline()
    if not line:
        consumer.wait(timeout=60)
        return {"variant": variant, "error": f"the consumer failed to start (exit {consumer.returncode})"}
    ready = json.loads(line)
    appended = 0
    with _producer(url, prefix, variant) as publish:
        interval = 1.0 / rate
        started = next_at = time.perf_counter()
        while time.perf_counter() - started < duration:
            now = time.perf_counter()
            if next_at > now:
                time.sleep(next_at - now)
            publish(f"fan-{appended % topics}", struct.pack(">q", time.time_ns()).ljust(PAYLOAD_SIZE, b"x"))
            appended += 1
            next_at += interval
        elapsed = time.perf_counter() - started
    report = json.loads(consumer.stdout.readline())
    consumer.wait(timeout=120)
    subscriptions = topics * per_topic
    return {
        "variant": variant,
        "gc_freeze": gc_freeze,
        "poll_interval": poll_interval or 1.0,
        "subscriptions": subscriptions,
        "topics": topics,
        "appends": appended,
        "append_rate_per_s": round(appended / elapsed),
        "expected_deliveries": appended * per_topic,
        "deliveries": report["deliveries"],
        "p50_ms": report["p50_ms"],
        "p99_ms": report["p99_ms"],
        "p999_ms": report["p999_ms"],
        "max_ms": report["max_ms"],
        "rss_before_mb": round(ready["rss_before"] / 1e6, 1),
        "rss_after_subscribing_mb": round(ready["rss_after"] / 1e6, 1),
        "rss_peak_mb": round(report["rss_peak"] / 1e6, 1),
        "rss_per_subscription_kb": round((ready["rss_after"] - ready["rss_before"]) / subscriptions / 1024, 2),
        "redis_connections": report["connections"],
        "consumer_cpu_share": report["consumer_cpu_share"],
        "gc_collections_by_generation": report["gc_collections"],
        "gc_longest_pause_ms_by_generation": report["gc_longest_pause_ms"],
        "target": "p99 <= 50 ms",
        "met": report["p99_ms"] <= 50 and report["deliveries"] == appended * per_topic,
    }


@contextlib.contextmanager
def _producer(url: str, prefix: str, variant: str) -> Iterator[Callable[[str, bytes], None]]:
    """``publish(topic, payload)`` through the durable stream or the broadcast channel's streams variant."""
    if variant == "broadcast":
        from api.core.broadcast_channel import create_broadcast_channel

        client = _raw(url)
        channel = create_broadcast_channel(client, "streams", key_prefix=prefix)
        try:
            yield lambda name, payload: channel.topic(name).publish(payload)
        finally:
            client.close()
        return
    from api.core.durable_stream import connect

    with connect(url, key_prefix=prefix) as backend:
        yield lambda name, payload: backend.topic(name).append(payload)


def fanout_consumer(
    url: str,
    prefix: str,
    topics: int,
    per_topic: int,
    duration: float,
    poll_interval: float | None,
    variant: str = "durable",
    gc_freeze: bool = False,
) -> None:
    """Runs under ``python -m gevent.monkey``: one greenlet per subscription.

    With ``gc_freeze`` it calls ``gc.freeze()`` after the warm-up, as a worker can once its
    long-lived objects exist: the cyclic GC's full collections then skip them, which is what their
    pauses (40 to 250 ms with 10,000 subscriptions in one process, by machine load) are made of.
    """
    import gevent
    import psutil

    from api.core.durable_stream import CLOSED, connect

    process = psutil.Process()
    rss_before = process.memory_info().rss
    subscriptions: list[Any] = []
    backend: Any = None
    client: Any = None
    watcher: Any = None
    if variant == "broadcast":
        import redis

        from api.core.broadcast_channel import create_broadcast_channel

        # One pooled connection per open subscription is how this variant works.
        client = redis.Redis.from_url(url, protocol=2, max_connections=topics * per_topic + 10)
        channel = create_broadcast_channel(client, "streams", key_prefix=prefix)
        for index in range(topics):
            for _ in range(per_topic):
                subscription = channel.topic(f"fan-{index}").subscribe()
                subscription.__enter__()
                subscriptions.append(subscription)
    else:
        options = {} if poll_interval is None else {"poll_interval": poll_interval}
        backend = connect(url, key_prefix=prefix, **options)
        for index in range(topics):
            topic = backend.topic(f"fan-{index}")
            for _ in range(per_topic):
                subscription = topic.subscribe_from_tail()
                subscription.__enter__()
                subscriptions.append(subscription)
        watcher = _raw(url)
        names = [f"fan-{index}" for index in range(topics)]
        deadline = time.monotonic() + 30
        while _subscribed(watcher, prefix, names) < topics and time.monotonic() < deadline:
            gevent.sleep(0.05)
    rss_after = process.memory_info().rss
    latencies: list[float] = []
    # Far away until the warm-up below is over: until then every greenlet only starts waiting.
    stop_at = [time.monotonic() + 3600]
    slow_ms = float(os.environ.get("FANOUT_DEBUG") or 0)
    slow: list[tuple[float, float]] = []

    def consume(subscription: Any) -> None:
        while time.monotonic() < stop_at[0]:
            result = subscription.receive(timeout=1.0)
            if result is None:
                continue
            if result is CLOSED:
                return
            payload = result if isinstance(result, bytes) else result.payload
            latency = (time.time_ns() - _stamp(payload)) / 1e6
            latencies.append(latency)
            if slow_ms and latency > slow_ms:
                slow.append((round(time.monotonic() - stop_at[0] + duration, 1), latency))

    rss_peak = [rss_after]

    def watch_memory() -> None:
        while time.monotonic() < stop_at[0]:
            rss_peak[0] = max(rss_peak[0], process.memory_info().rss)
            gevent.sleep(0.25)

    greenlets = [gevent.spawn(consume, subscription) for subscription in subscriptions]
    greenlets.append(gevent.spawn(watch_memory))
    # Warm-up: measure the steady state of a worker whose streams are open, not their first wait.
    # Opening 10,000 subscriptions promotes enough objects to trigger one full collection of the
    # cyclic GC soon after; running it here puts that one-off start-up cost before the window
    # instead of at a random point inside or outside it. Later full collections are not prevented.
    gevent.sleep(1.0)
    gc.collect()
    if gc_freeze:
        gc.freeze()
    pauses: list[list[float]] = [[], [], []]
    started_at = [0.0]

    def time_collections(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started_at[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append((time.perf_counter() - started_at[0]) * 1000)

    gc.callbacks.append(time_collections)
    stop_at[0] = time.monotonic() + duration
    print(json.dumps({"rss_before": rss_before, "rss_after": rss_after}), flush=True)
    cpu_before, wall_before = process.cpu_times(), time.monotonic()
    gevent.joinall(greenlets, timeout=duration + 30)
    cpu_after, wall = process.cpu_times(), time.monotonic() - wall_before
    gc.callbacks.remove(time_collections)
    if slow:
        by_time: dict[float, list[float]] = {}
        for at, latency in slow:
            by_time.setdefault(at, []).append(latency)
        for at, values in sorted(by_time.items()):
            print(f"slow at {at:5.1f} s: {len(values):6d} deliveries, worst {max(values):7.1f} ms", file=sys.stderr)
    cpu_share = (cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system) / wall
    if variant == "broadcast":
        connections = {"subscriptions": len(subscriptions)}  # one pooled connection each
        for subscription in subscriptions:
            subscription.close()
        client.close()
    else:
        connections = {"feed": _feed_links(watcher)}
        watcher.close()
        backend.close()
    print(
        json.dumps(
            {
                "deliveries": len(latencies),
                "p50_ms": round(percentile(latencies, 0.5), 3),
                "p99_ms": round(percentile(latencies, 0.99), 3),
                "p999_ms": round(percentile(latencies, 0.999), 3),
                "max_ms": round(max(latencies, default=float("nan")), 3),
                "rss_peak": rss_peak[0],
                "connections": connections,
                "consumer_cpu_share": round(cpu_share, 2),
                "gc_collections": [len(each) for each in pauses],
                "gc_longest_pause_ms": [round(max(each, default=0.0), 1) for each in pauses],
            }
        ),
        flush=True,
    )


# -- main -------------------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    cpu = cpu_model()
    import redis

    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _print_table(results: dict[str, Any]) -> None:
    rows: list[tuple[str, str, str, str, str]] = []
    if "append" in results:
        a = results["append"]
        rows.append(("append/s", f"{a['ours_per_s']}", f"{a['raw_xadd_per_s']}", f"{a['ratio']}x", a["target"]))
    if "latency" in results:
        lat = results["latency"]
        for layout, label, target in (
            ("", "", "<= 1.5x"),
            ("gevent_", " (gevent)", ""),
            ("same_process_", " (1 process)", ""),
        ):
            for name in ("p50", "p99"):
                rows.append(
                    (
                        f"latency{label} {name} ms",
                        f"{lat[f'{layout}ours_{name}_ms']}",
                        f"{lat[f'{layout}raw_xread_{name}_ms']}",
                        f"{lat[f'{layout}{name}_ratio']}x",
                        target,
                    )
                )
    if "catchup" in results:
        c = results["catchup"]
        for key in c:
            if key.startswith("ours_buffer_"):
                size = key.removeprefix("ours_buffer_").removesuffix("_per_s")
                rows.append(
                    (
                        f"catch-up/s (buffer {size})",
                        f"{c[key]}",
                        f"{c['raw_xread_count_500_per_s']}",
                        f"{c[f'ratio_buffer_{size}']}x",
                        ">= 0.3x",
                    )
                )
    if "broadcast_streams" in results:
        b = results["broadcast_streams"]
        rows.append(
            ("broadcast publish/s", f"{b['publish_per_s']}", f"{b['raw_xadd_per_s']}", f"{b['publish_ratio']}x", "")
        )
        rows.append(("broadcast latency p50 ms", f"{b['p50_ms']}", f"{b['raw_xread_p50_ms']}", "-", ""))
        rows.append(("broadcast latency p99 ms", f"{b['p99_ms']}", f"{b['raw_xread_p99_ms']}", "-", ""))
    for key, label in (
        ("fanout", "fan-out"),
        ("fanout_gc_frozen", "fan-out, gc.freeze()"),
        ("broadcast_streams_fanout", "broadcast fan-out"),
    ):
        if key in results and "error" in results[key]:
            rows.append((label, results[key]["error"], "-", "-", ""))
        elif key in results:
            f = results[key]
            rows.append((f"{label} p50 ms", f"{f['p50_ms']}", "-", "-", ""))
            rows.append((f"{label} p99 ms", f"{f['p99_ms']}", "-", "-", "<= 50 ms"))
            rows.append((f"{label} RSS/subscription KB", f"{f['rss_per_subscription_kb']}", "-", "-", "reported"))
            rows.append((f"{label} deliveries", f"{f['deliveries']}/{f['expected_deliveries']}", "-", "-", "all"))
            rows.append((f"{label} consumer CPU share", f"{f['consumer_cpu_share']}", "-", "-", ""))
    header = ("workload", "library", "raw redis-py", "ratio", "target")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(5)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)))
    for name, result in results.items():
        if isinstance(result, dict) and "met" in result:
            print(f"{name}: {'met' if result['met'] else 'NOT met'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redis", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing Redis server (default: start a private one)")
    parser.add_argument(
        "--only",
        default="append,latency,catchup,fanout,fanout_gc_frozen,broadcast,broadcast_fanout",
        help="comma-separated workloads",
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts, for a smoke run")
    parser.add_argument("--fanout-rate", type=float, default=2000.0, help="appends/s in total for fanout")
    parser.add_argument("--poll-interval", type=float, help="the adapter's poll_interval option for fanout")
    parser.add_argument("--variant", default="durable", help=argparse.SUPPRESS)
    parser.add_argument("--fanout-consumer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--gc-freeze", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--latency-producer", help=argparse.SUPPRESS)
    parser.add_argument("--latency-consumer", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--topics", type=int, default=1000, help=argparse.SUPPRESS)
    parser.add_argument("--per-topic", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=10.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.latency_consumer:
        latency_consumer(args.url, args.latency_consumer, args.count, args.rate)
        return
    if args.latency_producer:
        latency_producer(args.url, args.latency_producer, args.prefix, args.count, args.rate)
        return
    if args.fanout_consumer:
        fanout_consumer(
            args.url,
            args.prefix,
            args.topics,
            args.per_topic,
            args.duration,
            args.poll_interval,
            args.variant,
            args.gc_freeze,
        )
        return
    only = set(args.only.split(","))
    quick = args.quick
    results: dict[str, Any] = {"machine": _machine(), "command": " ".join(["python -m bench.redis", *sys.argv[1:]])}
    with _server(args.url) as url:
        results["server"] = "private redis-server" if not args.url else args.url
        if "append" in only:
            results["append"] = bench_append(url, 2000 if quick else 10000, 3 if quick else 5)
        if "latency" in only:
            results["latency"] = bench_latency(url, 300 if quick else 2000, 500.0, 1 if quick else 2)
        if "catchup" in only:
            results["catchup"] = bench_catchup(url, 10000 if quick else 100000, [128, 500])
        # 30 s: percentiles over 600,000 deliveries, long enough to include the cyclic GC's rare
        # full collections at their real frequency (the consumer reports how many it saw).
        for key, frozen in (("fanout", False), ("fanout_gc_frozen", True)):
            if key in only:
                results[key] = bench_fanout(
                    url,
                    100 if quick else 1000,
                    10,
                    200.0 if quick else args.fanout_rate,
                    3.0 if quick else 30.0,
                    args.poll_interval,
                    gc_freeze=frozen,
                )
        if "broadcast" in only:
            results["broadcast_streams"] = bench_broadcast(
                url, 2000 if quick else 10000, 3 if quick else 5, 300 if quick else 2000, 500.0
            )
        if "broadcast_fanout" in only:
            results["broadcast_streams_fanout"] = bench_fanout(
                url,
                100 if quick else 1000,
                10,
                200.0 if quick else args.fanout_rate,
                3.0 if quick else 10.0,
                variant="broadcast",
            )
    _print_table(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"redis-{datetime.date.today().isoformat()}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
