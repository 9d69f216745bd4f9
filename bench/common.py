"""What every benchmark reports the same way: percentiles and the machine it ran on."""

from __future__ import annotations

import contextlib
import pathlib
import platform
import random
import time

from api.core.durable_stream import CLOSED, DurableStreamBackend, DurableStreamSubscription


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` lie (the sample at index ``int(fraction * n)``)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, or what ``platform`` says."""
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or ""


def append_timestamps(writer: DurableStreamBackend, names: list[str], duration: float, rate: float) -> int:
    """The fan-out benchmarks' producer: ``time.time()`` to a random topic of ``names``, Poisson at
    ``rate`` a second for ``duration`` seconds, then (a second later) ``b"end"`` to every topic.

    Returns how many timestamps were appended.
    """
    sent = 0
    started = time.monotonic()
    while time.monotonic() - started < duration:
        writer.topic(random.choice(names)).append(repr(time.time()).encode())
        sent += 1
        time.sleep(random.expovariate(rate))
    time.sleep(1.0)
    for name in names:
        writer.topic(name).append(b"end")
    return sent


def follow_timestamps(backend: DurableStreamBackend, names: list[str], count: int, settle: float) -> list[float]:
    """The fan-out benchmarks' consumer, in a gevent-patched child: ``count`` subscriptions from the
    tail, spread round robin over ``names``, each in a greenlet, until each gets ``b"end"``.

    Prints ``ready`` once ``settle`` seconds have passed (past each subscription's first reads: the
    latencies measured are those of a process in its steady state). Returns the latencies (receive
    time minus the timestamp appended).
    """
    import gevent

    subscriptions = [backend.topic(names[i % len(names)]).subscribe_from_tail() for i in range(count)]
    for subscription in subscriptions:
        subscription.__enter__()
    latencies: list[float] = []

    def consume(subscription: DurableStreamSubscription) -> None:
        while True:
            record = subscription.receive(timeout=1.0)
            if record is None:
                continue
            if record is CLOSED or record.payload == b"end":
                return
            latencies.append(time.time() - float(record.payload))

    greenlets = [gevent.spawn(consume, subscription) for subscription in subscriptions]
    gevent.sleep(settle)
    print("ready", flush=True)
    gevent.joinall(greenlets, timeout=300)
    return latencies
