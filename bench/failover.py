"""What failover safety costs on Redis: the append latency with ``wait_replicas``, and the producer's repair.

``python -m bench.failover`` starts a private primary and replica (``harness.failover.RedisFailover``)
and measures, on loopback:

- the latency of one append (p50, p99 over ``--appends``) without ``WAIT`` and with ``wait_replicas=1``;
- the repair: a producer (``as_producer(repair_window=...)``) whose last ``k`` appends the promoted
  replica never received; how long its first append after the failover takes (the repair included),
  for several ``k``. Readers resuming at a lost position before that append is done are refused
  (``history_diverged``); that interval, from the promotion to the producer's next append, is the
  repair window, and this is its part the library adds.

The figures are in docs/reliability.md, "Failover".
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from api.core.durable_stream import DurableStreamUnavailableError, RepairingProducer, connect
from harness.failover import RedisFailover


def _latencies(url: str, appends: int, **options: object) -> tuple[float, float]:
    with connect(url, **options) as backend:
        topic = backend.topic(f"bench-{uuid.uuid4().hex}")
        payload = b"x" * 400
        for _ in range(50):  # warm the pool and the script cache
            topic.append(payload)
        spent = []
        for _ in range(appends):
            started = time.perf_counter()
            topic.append(payload)
            spent.append(time.perf_counter() - started)
    spent.sort()
    return statistics.median(spent) * 1000, spent[int(len(spent) * 0.99)] * 1000


def _repair_seconds(lost: int) -> float:
    with RedisFailover() as pair, connect(pair.url) as backend:
        producer = backend.topic(f"bench-{uuid.uuid4().hex}").as_producer(repair_window=1024)
        assert isinstance(producer, RepairingProducer)
        for index in range(20):
            producer.append(b"before %d" % index)
        pair.wait_replicated()
        pair.freeze_replication()
        for index in range(lost):
            producer.append(b"lost %d" % index)
        pair.fail_over()
        started = time.perf_counter()
        while True:
            try:
                producer.append(b"after")
                break
            except DurableStreamUnavailableError:
                time.sleep(0.01)
        spent = time.perf_counter() - started
        assert producer.repaired == lost, producer.repaired
        return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000)
    args = parser.parse_args()
    with RedisFailover() as pair:
        plain = _latencies(pair.url, args.appends)
        waiting = _latencies(pair.url, args.appends, wait_replicas=1)
    print(f"append latency, no WAIT:          p50 {plain[0]:.3f} ms  p99 {plain[1]:.3f} ms")
    print(f"append latency, wait_replicas=1:  p50 {waiting[0]:.3f} ms  p99 {waiting[1]:.3f} ms")
    for lost in (1, 10, 100, 1000):
        print(f"first append after a failover that lost {lost:4d}: {_repair_seconds(lost) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
