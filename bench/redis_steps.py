"""Where the Redis adapter's append → ``receive()`` latency goes, step by step.

Run with ``.venv/bin/python -m bench.redis_steps`` (a private ``redis-server``, or ``--url``). The
layout is the latency benchmark's target one (:mod:`bench.redis`): the producer appends from another
process, the consumer is a thread of this one. The shared listener and the subscription are timed
by wrapping two of their methods in this process only, so the figures carry a little of that
wrapping; the raw ``XREAD`` loop of the same rounds is printed beside them. Per round, medians of:

- ``stamp → hint``: from the producer's timestamp (taken just before ``append()``) to the listener
  starting on the hint (``Feed._on_hint``);
- ``hint → woken``: the listener parsing the hint, storing it in the prefetch and waking the topic;
- ``woken → read``: until the subscription's thread runs its read (``Subscription._fill``);
- ``read → returned``: until ``receive()`` has returned the record.

Nothing is written to ``bench/results``: this explains the latency benchmark, it does not replace it.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import threading
import time
import uuid
from typing import Any

from bench import redis as bench_redis


def _round(url: str, count: int, rate: float) -> dict[str, float]:
    from api.core.durable_stream import CLOSED, connect
    from api.core.durable_stream._redis_feed import Feed
    from api.core.durable_stream._subscription import Subscription

    hints: list[int] = []
    woken: list[int] = []
    reads: list[int] = []
    on_hint, fill = Feed._on_hint, Subscription._fill

    def timed_on_hint(self: Any, topic: str, message: bytes) -> None:
        hints.append(time.perf_counter_ns())
        on_hint(self, topic, message)
        woken.append(time.perf_counter_ns())

    def timed_fill(self: Any) -> None:
        reads.append(time.perf_counter_ns())
        fill(self)

    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    stamps: list[int] = []
    returned: list[int] = []
    Feed._on_hint, Subscription._fill = timed_on_hint, timed_fill  # type: ignore[method-assign]
    try:
        with (
            connect(url, key_prefix=prefix) as consumer,
            bench_redis._sender(url, "ours", prefix, count, rate, True) as start,
        ):
            consumer.topic("latency").append(bench_redis._payload(0))
            with consumer.topic("latency").subscribe_from_beginning() as subscription:
                subscription.receive(timeout=5)
                feed = consumer._driver._feeds[0]  # type: ignore[attr-defined]
                deadline = time.monotonic() + 10
                while "latency" not in feed.subscribed_topics() and time.monotonic() < deadline:
                    time.sleep(0.01)
                hints.clear(), woken.clear(), reads.clear()

                def consume() -> None:
                    while len(returned) < count:
                        result = subscription.receive(timeout=5)
                        if result is None or result is CLOSED:
                            return
                        returned.append(time.perf_counter_ns())
                        stamps.append(bench_redis._stamp(result.payload))

                reader = threading.Thread(target=consume)
                reader.start()
                start()
                reader.join(timeout=60)
    finally:
        Feed._on_hint, Subscription._fill = on_hint, fill  # type: ignore[method-assign]
    # One topic, records in order: the k-th hint carries the k-th record; the read that follows a
    # wake-up is the first one timed after it.
    count = min(len(stamps), len(returned), len(hints), len(woken))
    stamps, returned, hints, woken = stamps[:count], returned[:count], hints[:count], woken[:count]
    after_wake = [reads[min(bisect.bisect_left(reads, at), len(reads) - 1)] for at in woken]
    raw = bench_redis._latency_raw(url, count, rate, True)

    def median_us(begins: list[int], ends: list[int]) -> float:
        return round(statistics.median(end - begin for begin, end in zip(begins, ends, strict=True)) / 1000, 1)

    return {
        "total": median_us(stamps, returned),
        "raw_total": round(statistics.median(raw) * 1000, 1),
        "stamp_to_hint": median_us(stamps, hints),
        "hint_to_woken": median_us(hints, woken),
        "woken_to_read": median_us(woken, after_wake),
        "read_to_returned": median_us(after_wake, returned),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing Redis server (default: start a private one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=1000, help="records per round")
    parser.add_argument("--rate", type=float, default=500.0, help="appends/s")
    args = parser.parse_args(argv)
    columns = ("total", "raw_total", "stamp_to_hint", "hint_to_woken", "woken_to_read", "read_to_returned")
    print("p50 µs  " + "  ".join(f"{name:>16}" for name in columns))
    with bench_redis._server(args.url) as url:
        for index in range(args.rounds):
            figures = _round(url, args.count, args.rate)
            print(f"round {index}  " + "  ".join(f"{figures[name]:>16}" for name in columns), flush=True)


if __name__ == "__main__":
    main()
