"""Where the Redis adapter's append → ``receive()`` latency goes, step by step.

Run with ``.venv/bin/python -m bench.redis_steps`` (a private ``redis-server``, or ``--url``). The
layout is the latency benchmark's target one (:mod:`bench.redis`): the producer appends from another
process, the consumer is a thread of this one, which, as the lone waiting subscription, reads the
hints itself. The reader of the hints and the subscription are timed by wrapping two of their
methods in this process only, so the figures carry a little of that wrapping; the raw ``XREAD``
loop of the same rounds is printed beside them. Per round, medians of:

- ``stamp → hint``: from the producer's timestamp (taken just before ``append()``) to the reader
  starting on the hint (``RedisChangeFeed.deliver_hint``);
- ``hint → woken``: the reader parsing the hint, storing it in the prefetch and waking the topic;
- ``woken → read``: until the subscription's read reaches the driver (``RedisDriver.read``);
- ``read → returned``: until ``receive()`` has returned the record.

Nothing is written to ``bench/results``: this explains the latency benchmark, it does not replace it.
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import time
from typing import Any

from bench import redis as bench_redis


def _round(url: str, count: int, rate: float) -> dict[str, float]:
    from api.core.durable_stream.adapters.redis.driver import RedisDriver
    from api.core.durable_stream.adapters.redis.feed import RedisChangeFeed

    hints: list[int] = []
    woken: list[int] = []
    reads: list[int] = []
    on_hint, read = RedisChangeFeed.deliver_hint, RedisDriver.read

    def timed_on_hint(self: Any, topic: str, message: bytes) -> None:
        hints.append(time.perf_counter_ns())
        on_hint(self, topic, message)
        woken.append(time.perf_counter_ns())

    def timed_read(self: Any, *args: Any) -> Any:
        reads.append(time.perf_counter_ns())
        return read(self, *args)

    timings: list[tuple[int, int]] = []
    RedisChangeFeed.deliver_hint, RedisDriver.read = timed_on_hint, timed_read  # type: ignore[method-assign]
    try:
        bench_redis._latency_ours(url, count, rate, True, timings)
    finally:
        RedisChangeFeed.deliver_hint, RedisDriver.read = on_hint, read  # type: ignore[method-assign]
    raw = bench_redis._latency_raw(url, count, rate, True)

    def first_after(marks: list[int], at: int) -> int:
        return marks[min(bisect.bisect_left(marks, at), len(marks) - 1)]

    # Records are 1/rate apart and every step takes far less, so each record's steps are the first
    # marks after its stamp (set-up reads and hints before the first stamp are skipped that way).
    names = ("total", "stamp_to_hint", "hint_to_woken", "woken_to_read", "read_to_returned")
    steps: dict[str, list[int]] = {name: [] for name in names}
    for stamp, returned in timings:
        hint_index = min(bisect.bisect_left(hints, stamp), len(hints) - 1)
        hint, wake = hints[hint_index], woken[hint_index]
        read = first_after(reads, wake)
        steps["total"].append(returned - stamp)
        steps["stamp_to_hint"].append(hint - stamp)
        steps["hint_to_woken"].append(wake - hint)
        steps["woken_to_read"].append(read - wake)
        steps["read_to_returned"].append(returned - read)
    figures = {name: round(statistics.median(values) / 1000, 1) for name, values in steps.items()}
    figures["raw_total"] = round(statistics.median(raw) * 1000, 1)
    return figures


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
