"""NATS JetStream adapter benchmarks against raw nats-py loops doing the same work.

Run with ``.venv/bin/python -m bench.nats``. A private ``nats-server`` (JetStream, file storage) is
started on a free loopback port; ``--url nats://host:port`` uses an existing server (≥ 2.11) instead.
Both sides of every comparison run in one process against the same server. A table is printed;
``--json PATH`` also writes the figures.

Workloads:

- ``append``: ``topic.append()`` rate vs a raw loop of ``js.publish()`` with the same headers (ordinal,
  epoch and ``Nats-Expected-Last-Subject-Sequence`` from the previous acknowledgement), one thread,
  200-byte payloads.
- ``latency``: append → ``receive()`` p50/p99 with the producer in another thread vs a raw ordered
  push consumer fed by raw publishes.
- ``catchup``: draining 20,000 retained records through one subscription (``buffer_size=500``) vs a
  raw pull consumer fetching batches of 500.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import nats

from api.core.durable_stream import CLOSED, connect
from harness.nats_server import NatsServer

PAYLOAD_SIZE = 200
APPENDS = 3000
LATENCY_SAMPLES = 1000
CATCHUP_RECORDS = 20_000


def _payload(stamp_ns: int) -> bytes:
    return struct.pack(">q", stamp_ns).ljust(PAYLOAD_SIZE, b"x")


def _stamp(payload: bytes) -> int:
    return int(struct.unpack(">q", payload[:8])[0])


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


# -- the adapter ----------------------------------------------------------------------------------


def adapter_append(url: str) -> float:
    with connect(url, stream="BENCH_A", subject_prefix="bench.a") as backend:
        topic = backend.topic(f"append-{uuid.uuid4().hex}")
        topic.append(_payload(0))
        started = time.perf_counter()
        for _ in range(APPENDS):
            topic.append(_payload(0))
        return APPENDS / (time.perf_counter() - started)


def adapter_latency(url: str) -> tuple[float, float]:
    with connect(url, stream="BENCH_A", subject_prefix="bench.a") as backend:
        topic = backend.topic(f"latency-{uuid.uuid4().hex}")
        samples: list[float] = []
        with topic.subscribe_from_tail() as subscription:

            def produce() -> None:
                for _ in range(LATENCY_SAMPLES):
                    topic.append(_payload(time.perf_counter_ns()))
                    time.sleep(0.002)

            producer = threading.Thread(target=produce)
            producer.start()
            while len(samples) < LATENCY_SAMPLES:
                record = subscription.receive(timeout=5)
                assert record is not None and record is not CLOSED
                samples.append((time.perf_counter_ns() - _stamp(record.payload)) / 1e6)
            producer.join()
        return _percentiles(samples)


def adapter_catchup(url: str) -> float:
    with connect(url, stream="BENCH_A", subject_prefix="bench.a", buffer_size=500) as backend:
        topic = backend.topic(f"catchup-{uuid.uuid4().hex}")
        for _ in range(CATCHUP_RECORDS):
            topic.append(_payload(0))
        # A second backend object: nothing of the appends is cached in it.
        with connect(url, stream="BENCH_A", subject_prefix="bench.a", buffer_size=500) as reader:
            started = time.perf_counter()
            with reader.topic(topic.name).subscribe_from_beginning() as subscription:  # type: ignore[attr-defined]
                for _ in range(CATCHUP_RECORDS):
                    assert subscription.receive(timeout=5) not in (None, CLOSED)
            return CATCHUP_RECORDS / (time.perf_counter() - started)


# -- raw nats-py ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _raw(url: str) -> Any:
    nc = await nats.connect(url)
    js = nc.jetstream()
    with contextlib.suppress(Exception):
        await js.add_stream(name="BENCH_RAW", subjects=["bench.raw.>"], allow_direct=True)
    try:
        yield nc, js
    finally:
        await nc.close()


def raw_append(url: str) -> float:
    async def run() -> float:
        async with _raw(url) as (_, js):
            subject = f"bench.raw.{uuid.uuid4().hex}"
            last, epoch = 0, uuid.uuid4().hex[:16]
            started = time.perf_counter()
            for ordinal in range(1, APPENDS + 1):
                headers = {"Ds-O": str(ordinal), "Ds-E": epoch, "Nats-Expected-Last-Subject-Sequence": str(last)}
                ack = await js.publish(subject, _payload(0), headers=headers)
                last = ack.seq
            return APPENDS / (time.perf_counter() - started)

    return asyncio.run(run())


def raw_latency(url: str) -> tuple[float, float]:
    async def run() -> tuple[float, float]:
        async with _raw(url) as (_, js):
            subject = f"bench.raw.{uuid.uuid4().hex}"
            samples: list[float] = []
            done = asyncio.Event()

            async def on_message(msg: Any) -> None:
                samples.append((time.perf_counter_ns() - _stamp(msg.data)) / 1e6)
                if len(samples) >= LATENCY_SAMPLES:
                    done.set()

            sub = await js.subscribe(subject, cb=on_message, ordered_consumer=True)
            for _ in range(LATENCY_SAMPLES):
                await js.publish(subject, _payload(time.perf_counter_ns()))
                await asyncio.sleep(0.002)
            await asyncio.wait_for(done.wait(), 30)
            await sub.unsubscribe()
            return _percentiles(samples)

    return asyncio.run(run())


def raw_catchup(url: str) -> float:
    async def run() -> float:
        async with _raw(url) as (_, js):
            subject = f"bench.raw.{uuid.uuid4().hex}"
            for _ in range(CATCHUP_RECORDS):
                await js.publish(subject, _payload(0))
            started = time.perf_counter()
            sub = await js.pull_subscribe(subject, durable=None)
            got = 0
            while got < CATCHUP_RECORDS:
                batch = await sub.fetch(500, timeout=5)
                for msg in batch:
                    await msg.ack()
                got += len(batch)
            rate = CATCHUP_RECORDS / (time.perf_counter() - started)
            await sub.unsubscribe()
            return rate

    return asyncio.run(run())


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    with NatsServer() as server:
        yield server.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing NATS server (>= 2.11) instead of a private one")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    with _server(args.url) as url:
        figures: dict[str, Any] = {}
        figures["append"] = {"adapter_per_s": adapter_append(url), "raw_per_s": raw_append(url)}
        figures["latency_ms"] = {"adapter_p50_p99": adapter_latency(url), "raw_p50_p99": raw_latency(url)}
        figures["catchup"] = {"adapter_per_s": adapter_catchup(url), "raw_per_s": raw_catchup(url)}
    append, latency, catchup = figures["append"], figures["latency_ms"], figures["catchup"]
    rows = [
        ("append/s", append["adapter_per_s"], append["raw_per_s"], append["adapter_per_s"] / append["raw_per_s"]),
        ("latency p50 ms", latency["adapter_p50_p99"][0], latency["raw_p50_p99"][0], None),
        ("latency p99 ms", latency["adapter_p50_p99"][1], latency["raw_p50_p99"][1], None),
        (
            "catch-up rec/s",
            catchup["adapter_per_s"],
            catchup["raw_per_s"],
            catchup["adapter_per_s"] / catchup["raw_per_s"],
        ),
    ]
    print(f"{'workload':<16} {'adapter':>12} {'raw nats-py':>12} {'ratio':>7}")
    for name, ours, raw, ratio in rows:
        shown = f"{ratio:.2f}x" if ratio is not None else f"{ours / raw:.2f}x"
        print(f"{name:<16} {ours:>12.2f} {raw:>12.2f} {shown:>7}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=2)


if __name__ == "__main__":
    main()
