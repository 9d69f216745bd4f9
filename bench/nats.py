"""NATS JetStream adapter benchmarks against raw nats-py loops doing the same work.

Run with ``.venv/bin/python -m bench.nats``. A private ``nats-server`` (JetStream, file storage,
monitoring on another free port) is started on a free loopback port; ``--url nats://host:port`` uses
an existing server (≥ 2.11) instead, without the connection count. Both sides of every comparison
run in one process against the same server, in alternating rounds (the machine is shared: a burst of
other load then hits both sides alike); rates are compared by the median of the rounds' ratios, and
latencies both pooled and by the median of the rounds' ratios. A table
is printed and the figures are written to ``bench/results/nats-<date>.json``.

Workloads:

- ``append``: ``topic.append()`` rate vs a raw loop of ``js.publish()`` with the same headers
  (ordinal, epoch and ``Nats-Expected-Last-Subject-Sequence`` from the previous acknowledgement,
  ``Nats-Expected-Stream``), one thread, 200-byte payloads.
- ``latency``: append → ``receive()`` p50/p99 with the producer in another thread of the process vs a
  raw ordered consumer (``ordered_consumer=True``, push) fed by raw compare-and-set publishes that
  wait for their acknowledgements, 2 ms apart.
- ``catchup``: draining 100,000 retained records of one topic through one subscription
  (``buffer_size=500``) of a fresh backend object vs a raw pull consumer fetching batches of 500 of the
  same subject (``ack_policy`` none: the adapter acknowledges nothing either).
- ``fanout`` (:mod:`bench.nats_fanout`): 2,000 subscriptions on 200 topics in one gevent process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import pathlib
import platform
import statistics
import struct
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import nats
from nats.aio.client import __version__ as nats_version
from nats.js.api import AckPolicy, ConsumerConfig

from api.core.durable_stream import CLOSED, connect
from bench import nats_fanout
from bench.common import cpu_model, percentile
from harness.nats_server import NatsServer
from harness.redis_server import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAYLOAD_SIZE = 200
ROUNDS = 5
APPENDS_PER_ROUND = 1000
LATENCY_ROUNDS = 10
LATENCY_PER_ROUND = 200
CATCHUP_RECORDS = 100_000
_STREAM = "BENCH_A"
_PREFIX = "bench.a"


def _payload(stamp_ns: int) -> bytes:
    return struct.pack(">q", stamp_ns).ljust(PAYLOAD_SIZE, b"x")


def _stamp(payload: bytes) -> int:
    return int(struct.unpack(">q", payload[:8])[0])


def _ms(samples: list[float], fraction: float) -> float:
    return round(percentile(samples, fraction), 3)


# -- the adapter ----------------------------------------------------------------------------------


def adapter_append(backend: Any) -> float:
    topic = backend.topic(f"append-{uuid.uuid4().hex}")
    topic.append(_payload(0))
    started = time.perf_counter()
    for _ in range(APPENDS_PER_ROUND):
        topic.append(_payload(0))
    return APPENDS_PER_ROUND / (time.perf_counter() - started)


def adapter_latency(backend: Any) -> list[float]:
    topic = backend.topic(f"latency-{uuid.uuid4().hex}")
    samples: list[float] = []
    with topic.subscribe_from_tail() as subscription:

        def produce() -> None:
            for _ in range(LATENCY_PER_ROUND):
                topic.append(_payload(time.perf_counter_ns()))
                time.sleep(0.002)

        producer = threading.Thread(target=produce)
        producer.start()
        while len(samples) < LATENCY_PER_ROUND:
            record = subscription.receive(timeout=5)
            assert record is not None and record is not CLOSED
            samples.append((time.perf_counter_ns() - _stamp(record.payload)) / 1e6)
        producer.join()
    return samples


def adapter_catchup(url: str, subject_token: str) -> float:
    # A fresh backend object: nothing of the topic is cached in it.
    with connect(url, stream=_STREAM, subject_prefix=_PREFIX, buffer_size=500) as reader:
        name = _topic_name(subject_token)
        started = time.perf_counter()
        with reader.topic(name).subscribe_from_beginning() as subscription:
            for _ in range(CATCHUP_RECORDS):
                assert subscription.receive(timeout=5) not in (None, CLOSED)
        return CATCHUP_RECORDS / (time.perf_counter() - started)


def _topic_name(token: str) -> str:
    return f"catchup-{token}"


# -- raw nats-py ----------------------------------------------------------------------------------


class Raw:
    """One raw nats-py connection on its own loop (in this thread, run round by round)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.nc = self.loop.run_until_complete(nats.connect(url))
        self.js = self.nc.jetstream()

    def close(self) -> None:
        self.loop.run_until_complete(self.nc.close())
        self.loop.close()

    async def _publish(self, subject: str, ordinal: int, epoch: str, last: int, stamp: int, timeout: float = 5) -> int:
        headers = {
            "Ds-O": str(ordinal),
            "Ds-E": epoch,
            "Nats-Expected-Last-Subject-Sequence": str(last),
            "Nats-Expected-Stream": _STREAM,
        }
        ack = await self.js.publish(subject, _payload(stamp), headers=headers, timeout=timeout)
        return int(ack.seq)

    def append(self) -> float:
        async def run() -> float:
            subject = f"{_PREFIX}.raw{uuid.uuid4().hex}"
            epoch = uuid.uuid4().hex[:16]
            last = await self._publish(subject, 1, epoch, 0, 0)
            started = time.perf_counter()
            for ordinal in range(2, APPENDS_PER_ROUND + 2):
                last = await self._publish(subject, ordinal, epoch, last, 0)
            return APPENDS_PER_ROUND / (time.perf_counter() - started)

        return self.loop.run_until_complete(run())

    def latency(self) -> list[float]:
        async def run() -> list[float]:
            subject = f"{_PREFIX}.raw{uuid.uuid4().hex}"
            epoch = uuid.uuid4().hex[:16]
            samples: list[float] = []
            done = asyncio.Event()

            async def on_message(msg: Any) -> None:
                samples.append((time.perf_counter_ns() - _stamp(msg.data)) / 1e6)
                if len(samples) >= LATENCY_PER_ROUND:
                    done.set()

            sub = await self.js.subscribe(subject, cb=on_message, ordered_consumer=True, stream=_STREAM)
            last = 0
            for ordinal in range(1, LATENCY_PER_ROUND + 1):
                last = await self._publish(subject, ordinal, epoch, last, time.perf_counter_ns())
                await asyncio.sleep(0.002)
            await asyncio.wait_for(done.wait(), 30)
            await sub.unsubscribe()
            return samples

        return self.loop.run_until_complete(run())

    def fill(self, subject: str, count: int) -> None:
        """``count`` records in the adapter's format (see its card), pipelined: the stream is this run's
        own, so each message's subject sequence is known in advance and every publish still carries
        the compare-and-set header."""

        async def run() -> None:
            epoch = uuid.uuid4().hex[:16]
            info = await self.js.stream_info(_STREAM)
            base = info.state.last_seq
            chunk = 500
            for start in range(0, count, chunk):
                await asyncio.gather(
                    *(
                        self._publish(subject, index + 1, epoch, 0 if index == 0 else base + index, 0, timeout=60)
                        for index in range(start, min(count, start + chunk))
                    )
                )

        self.loop.run_until_complete(run())

    def catchup(self, subject: str) -> float:
        async def run() -> float:
            started = time.perf_counter()
            # No acknowledgements: the adapter's reader acknowledges nothing either.
            config = ConsumerConfig(ack_policy=AckPolicy.NONE)
            sub = await self.js.pull_subscribe(subject, durable=None, stream=_STREAM, config=config)
            got = 0
            while got < CATCHUP_RECORDS:
                batch = await sub.fetch(500, timeout=5)
                got += len(batch)
            rate = CATCHUP_RECORDS / (time.perf_counter() - started)
            await sub.unsubscribe()
            return rate

        return self.loop.run_until_complete(run())


# -- the run --------------------------------------------------------------------------------------


def _alternate(rounds: int, ours: Any, theirs: Any) -> tuple[list[Any], list[Any]]:
    mine: list[Any] = []
    raw: list[Any] = []
    for index in range(rounds):
        first, second = (ours, theirs) if index % 2 == 0 else (theirs, ours)
        a, b = first(), second()
        if first is ours:
            mine.append(a)
            raw.append(b)
        else:
            mine.append(b)
            raw.append(a)
    return mine, raw


def run(url: str, monitor: str | None, skip_fanout: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "adapter": "nats",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model(),
            "python": platform.python_version(),
            "nats_py": nats_version,
            "load_average_at_start": os.getloadavg(),
        },
        "payload_bytes": PAYLOAD_SIZE,
        "rounds": ROUNDS,
    }
    raw = Raw(url)
    version = raw.nc.connected_server_version
    results["server_version"] = f"{version.major}.{version.minor}.{version.patch}"
    backend = connect(url, stream=_STREAM, subject_prefix=_PREFIX)  # creates the stream (with republish)
    try:
        print("... append", file=sys.stderr, flush=True)
        ours, theirs = _alternate(ROUNDS, lambda: adapter_append(backend), raw.append)
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        results["append"] = {
            "adapter_per_s": [round(x) for x in ours],
            "raw_per_s": [round(x) for x in theirs],
            "ratio_median": round(statistics.median(ratios), 3),
            "ratios": [round(x, 3) for x in ratios],
        }
        print("... latency", file=sys.stderr, flush=True)
        ours, theirs = _alternate(LATENCY_ROUNDS, lambda: adapter_latency(backend), raw.latency)
        mine = [x for part in ours for x in part]
        other = [x for part in theirs for x in part]
        results["latency_ms"] = {
            "samples_each": len(mine),
            "adapter_p50": _ms(mine, 0.5),
            "adapter_p99": _ms(mine, 0.99),
            "raw_p50": _ms(other, 0.5),
            "raw_p99": _ms(other, 0.99),
            "p50_ratio": round(percentile(mine, 0.5) / percentile(other, 0.5), 3),
            "p99_ratio": round(percentile(mine, 0.99) / percentile(other, 0.99), 3),
        }
        for name, fraction in (("p50", 0.5), ("p99", 0.99)):
            # Per pair of neighbouring rounds: a burst of other load hits one round, not the median.
            per_round = [percentile(a, fraction) / percentile(b, fraction) for a, b in zip(ours, theirs, strict=True)]
            results["latency_ms"][f"round_{name}_ratios"] = [round(x, 3) for x in per_round]
            results["latency_ms"][f"{name}_ratio_round_median"] = round(statistics.median(per_round), 3)
        print("... catch-up", file=sys.stderr, flush=True)
        token = uuid.uuid4().hex
        subject = f"{_PREFIX}.{_subject_token(_topic_name(token))}"
        raw.fill(subject, CATCHUP_RECORDS)
        ours, theirs = _alternate(2, lambda: adapter_catchup(url, token), lambda: raw.catchup(subject))
        results["catchup"] = {
            "records": CATCHUP_RECORDS,
            "buffer_size": 500,
            "adapter_per_s": [round(x) for x in ours],
            "raw_per_s": [round(x) for x in theirs],
            "ratio_median": round(statistics.median(a / b for a, b in zip(ours, theirs, strict=True)), 3),
        }
    finally:
        backend.close()
        raw.close()
    if not skip_fanout:
        print("... fan-out (gevent child)", file=sys.stderr, flush=True)
        results["fanout"] = nats_fanout.run(url, monitor)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    return results


def _subject_token(topic: str) -> str:
    from api.core.durable_stream.adapters.nats.topics import subject_token

    return subject_token(topic)


def _table(results: dict[str, Any]) -> str:
    append, latency, catchup = results["append"], results["latency_ms"], results["catchup"]
    load = results["machine"]
    lines = [
        f"NATS JetStream adapter vs raw nats-py ({results['date']}, server {results['server_version']}, "
        f"load {load['load_average_at_start'][0]:.1f} -> {load['load_average_at_end'][0]:.1f})",
        f"{'workload':<22} {'adapter':>12} {'raw nats-py':>12} {'ratio':>7}",
        f"{'append/s (median)':<22} {statistics.median(append['adapter_per_s']):>12.0f} "
        f"{statistics.median(append['raw_per_s']):>12.0f} {append['ratio_median']:>6.2f}x",
        f"{'latency p50 ms':<22} {latency['adapter_p50']:>12.3f} {latency['raw_p50']:>12.3f} "
        f"{latency['p50_ratio']:>6.2f}x (median of rounds {latency['p50_ratio_round_median']:.2f}x)",
        f"{'latency p99 ms':<22} {latency['adapter_p99']:>12.3f} {latency['raw_p99']:>12.3f} "
        f"{latency['p99_ratio']:>6.2f}x (median of rounds {latency['p99_ratio_round_median']:.2f}x)",
        f"{'catch-up rec/s':<22} {statistics.median(catchup['adapter_per_s']):>12.0f} "
        f"{statistics.median(catchup['raw_per_s']):>12.0f} {catchup['ratio_median']:>6.2f}x",
    ]
    fan = results.get("fanout")
    if fan is not None:
        lines.append(
            f"fan-out {fan['subscriptions']} subscriptions / {fan['topics']} topics (gevent): "
            f"deliveries {fan['deliveries']}/{fan['expected_deliveries']}, p50 {fan['p50_ms']} ms, "
            f"p99 {fan['p99_ms']} ms, max {fan['max_ms']} ms, connections {fan['peak_connections']}, "
            f"server consumers {fan['peak_consumers']}"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[tuple[str, str | None]]:
    if url is not None:
        yield url, None
        return
    with NatsServer(monitor_port=free_port()) as server:
        yield server.url, f"http://127.0.0.1:{server.monitor_port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing NATS server (>= 2.11) instead of a private one")
    parser.add_argument("--output", type=pathlib.Path, default=ROOT / "bench" / "results")
    parser.add_argument("--no-fanout", action="store_true", help="skip the gevent fan-out workload")
    args = parser.parse_args(argv)
    with _server(args.url) as (url, monitor):
        results = run(url, monitor, args.no_fanout)
    print(_table(results))
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"nats-{datetime.date.today().isoformat()}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
