"""The NATS fan-out workload: 2,000 subscriptions on 200 topics in one gevent process.

:func:`run` starts a child ``python -m gevent.monkey --module bench.nats_fanout`` (the shape of an
API worker) that opens 2,000 subscriptions from the tail, 10 per topic, each in its own greenlet
looping on ``receive(timeout=1.0)``. The parent appends timestamps to random topics at ~100/s for
15 s (each append is delivered to 10 subscriptions), then an end marker to every topic. Meanwhile it
samples the server's connections of the child (``/connz`` of the monitoring port, by the
connection name) and the server's JetStream consumers (``/jsz``) every 0.1 s. Latencies are
measured after the child's start-up reads have settled.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from typing import Any

from api.core.durable_stream import connect
from bench.common import append_timestamps, follow_timestamps, percentile

SUBSCRIPTIONS = 2000
TOPICS = 200
RATE = 100.0
DURATION = 15.0
CHILD = ["--module", "bench.nats_fanout"]
_STREAM = "BENCH_F"
_PREFIX = "bench.f"


def _ms(value: float) -> float:
    return round(value * 1000, 3)


def child(argv: list[str]) -> None:
    """In the gevent-patched child: the subscriptions; latencies reported as JSON on stdout."""
    url, name, count, *names = argv
    backend = connect(url, stream=_STREAM, subject_prefix=_PREFIX, name=name)
    latencies = follow_timestamps(backend, names, int(count), settle=2.0)
    backend.close()
    result = {
        "deliveries": len(latencies),
        "p50_ms": _ms(percentile(latencies, 0.5)),
        "p90_ms": _ms(percentile(latencies, 0.9)),
        "p99_ms": _ms(percentile(latencies, 0.99)),
        "over_100ms": sum(1 for latency in latencies if latency > 0.1),
        "max_ms": _ms(max(latencies, default=0.0)),
    }
    print(json.dumps(result), flush=True)


def _connections(monitor: str, name: str) -> int:
    with urllib.request.urlopen(f"{monitor}/connz?limit=10000", timeout=2) as reply:
        found = json.load(reply)
    return sum(1 for conn in found.get("connections", []) if conn.get("name") == name)


def _consumers(monitor: str) -> int:
    """JetStream consumers on the whole (private) server."""
    with urllib.request.urlopen(f"{monitor}/jsz", timeout=2) as reply:
        return int(json.load(reply).get("consumers", 0))


def run(url: str, monitor: str | None) -> dict[str, Any]:
    names = [f"fan-{uuid.uuid4().hex[:8]}-{index}" for index in range(TOPICS)]
    name = f"fanout-{uuid.uuid4().hex[:8]}"
    with connect(url, stream=_STREAM, subject_prefix=_PREFIX) as writer:
        for topic in names:
            writer.topic(topic).append(b"0")  # the topics exist before the child subscribes
        command = [sys.executable, "-m", "gevent.monkey", *CHILD, url, name]
        child_process = subprocess.Popen([*command, str(SUBSCRIPTIONS), *names], stdout=subprocess.PIPE, text=True)
        assert child_process.stdout is not None
        ready = child_process.stdout.readline().strip()
        if ready != "ready":
            child_process.kill()
            raise RuntimeError(f"fan-out child failed to start: {ready!r}")
        peaks = {"connections": 0, "consumers": 0}
        stop = threading.Event()

        def sample() -> None:
            while monitor is not None and not stop.is_set():
                peaks["connections"] = max(peaks["connections"], _connections(monitor, name))
                peaks["consumers"] = max(peaks["consumers"], _consumers(monitor))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        sent = append_timestamps(writer, names, DURATION, RATE)
        output, _ = child_process.communicate(timeout=300)
        stop.set()
        sampler.join()
    stats = json.loads(output.strip().splitlines()[-1])
    per_topic = SUBSCRIPTIONS // TOPICS
    return {
        "subscriptions": SUBSCRIPTIONS,
        "topics": TOPICS,
        "runtime": "gevent (monkey-patched), one process",
        "appends": sent,
        "append_rate_per_s": RATE,
        "expected_deliveries": sent * per_topic,
        **stats,
        "peak_connections": peaks["connections"] if monitor is not None else None,
        "peak_consumers": peaks["consumers"] if monitor is not None else None,
    }


if __name__ == "__main__":
    child(sys.argv[1:])
