"""Scenario 5: one SSE client stops reading for a minute while its run streams.

A producer process appends the run's events at a fixed rate through the library (as a Celery worker
would) and times every append. A healthy client reads the run throughout. After ``before`` seconds
a second client connects through the other gunicorn server with a small receive buffer
(``SO_RCVBUF``) and then reads nothing for ``stall`` seconds: the server's writes to it block once
the socket buffers are full. The producer's append latency with the stalled client attached is
compared with its latency without it (the ``before`` seconds and the ``after`` seconds following
the stall): p50 and p99 ratios must stay ≤ 1.2. Afterwards the stalled client reads on and must get
every event of the run (or a 410).
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import connect
from tests.support.processes import ROOT, process_env
from tests.support.served_stack import ServedStack
from tests.support.sse import parse_sse
from tests.support.sse_client import Connection, read_run

from .report import Table, percentile
from .services import Services, stream_store
from .stack import server_problems, soak_env, stored_events
from .workflows import streaming_workflow

STORES = ("sqlite", "redis", "postgres")
RATIO_LIMIT = 1.2
COLUMNS = [
    "stream store",
    "appends without / with",
    "p50 ms without / with",
    "p50 ratio",
    "p99 ms without / with",
    "p99 ratio",
    "queued at the stall's end (server send / client receive)",
    "writer blocked for (s)",
    "p50 / p99 ratio while blocked",
    "stalled client",
    "healthy client",
]


@dataclasses.dataclass
class SlowClientOptions:
    stores: Sequence[str] = STORES
    rate: float = 100.0
    before: float = 20.0
    stall: float = 60.0
    after: float = 20.0
    #: Left out of the "without" samples: the stalled client catching up on everything it missed.
    catch_up: float = 3.0
    warm_up: float = 2.0
    receive_buffer: int = 4096


def run(found: Services, directory: pathlib.Path, options: SlowClientOptions) -> Table:
    table = Table(
        "slow-client",
        f"Slow client: one client reads nothing for {options.stall:g} s while its run streams",
        COLUMNS,
        settings={"append rate /s": options.rate, "SO_RCVBUF": options.receive_buffer},
        notes=[
            f"A producer process appends ~2 KB events to the run's topic; 'without' is the {options.before:g} s "
            f"before the stalled client connects and the {options.after:g} s after its stall (less the first "
            f"{options.catch_up:g} s, while it catches up), 'with' the stall. A healthy client reads throughout.",
            f"Target: both ratios ≤ {RATIO_LIMIT}. 'queued': bytes in the server's send queue and the stalled "
            "client's receive queue (`ss`) when the stall ended. Until those buffers filled, the server wrote "
            "to the stalled client like to any reader; 'writer blocked for' is the part of the stall after "
            "its send queue stopped growing, and its ratios are that part's p50 and p99 over the 'without' ones.",
        ],
    )
    began = time.monotonic()
    for kind in options.stores:
        table.add(_store(found, directory / f"slow-{kind}", kind, options, table))
    table.seconds = time.monotonic() - began
    return table


def _store(
    found: Services, directory: pathlib.Path, kind: str, options: SlowClientOptions, table: Table
) -> dict[str, Any]:
    with stream_store(kind, found, directory) as stream_url:
        # No Celery worker consumes the run's task: the producer process writes the run's events. The
        # start deadline is off so that nobody ends the run meanwhile.
        env = soak_env(directory / "var", found, stream_url, WORKFLOW_START_TIMEOUT=0)
        with ServedStack(env, directory, servers=2, workers_per_server=1, celery_workers=0) as stack:
            key = stack.create_app(streaming_workflow(1, 0))
            created = _start_run(stack.urls[0], key)
            task_id, run_id = created["task_id"], created["workflow_run_id"]
            healthy: list[Connection] = []
            reader = threading.Thread(target=lambda: healthy.append(read_run(stack.urls[0], key, task_id)))
            reader.start()
            samples_path = directory / "samples.json"
            duration = options.before + options.stall + options.after
            producer = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.soak.producer",
                    f"--url={stream_url}",
                    f"--topic={workflow_run_topic('workflow', run_id)}",
                    f"--task-id={task_id}",
                    f"--run-id={run_id}",
                    f"--rate={options.rate}",
                    f"--duration={duration}",
                    f"--out={samples_path}",
                ],
                cwd=ROOT,
                env=process_env(env),
            )
            try:
                time.sleep(options.before)  # the baseline: no stalled client yet
                stall_began = time.monotonic()
                stalled = StalledClient(stack.servers[1].port, key, task_id, options.receive_buffer)
                queue_growth = stalled.watch_queue(stall_began + options.stall)
                queued = stalled.queued()
                stall_ended = time.monotonic()
                stalled_events, stalled_error = stalled.read_on()
                if producer.wait(timeout=options.after + 120) != 0:
                    table.problems.append(f"{kind}: the producer failed (exit {producer.returncode})")
            finally:
                if producer.poll() is None:
                    producer.kill()
            reader.join(timeout=60)
            table.problems.extend(server_problems(kind, stack)[1])
        samples = json.loads(samples_path.read_text())["samples"]
        with connect(stream_url) as backend:
            stored, sealed = stored_events(backend, run_id)
    # The producer's first appends open its connections: not part of either phase.
    samples = [s for s in samples if s[0] >= samples[0][0] + options.warm_up]
    without = [s[1] * 1000 for s in samples if s[0] < stall_began or s[0] >= stall_ended + options.catch_up]
    with_stall = [s[1] * 1000 for s in samples if stall_began <= s[0] < stall_ended]
    p50 = (percentile(without, 0.5), percentile(with_stall, 0.5))
    p99 = (percentile(without, 0.99), percentile(with_stall, 0.99))
    # Until the socket buffers are full the server still writes to the stalled client like to any
    # reader; from then on its writes are blocked. That part of the stall, on its own:
    blocked_since = _blocked_since(queue_growth)
    blocked = [s[1] * 1000 for s in samples if blocked_since is not None and blocked_since <= s[0] < stall_ended]
    stalled_outcome = _outcome(stalled_events, stalled_error, stored, sealed)
    healthy_outcome = _outcome([i.event for i in healthy[0].events] if healthy else [], None, stored, sealed)
    for name, outcome in (("stalled", stalled_outcome), ("healthy", healthy_outcome)):
        if outcome not in ("every event", "410"):
            table.problems.append(f"{kind}: the {name} client: {outcome}")
    for name, pair in (("p50", p50), ("p99", p99)):
        if pair[1] / pair[0] > RATIO_LIMIT:
            table.problems.append(f"{kind}: {name} append latency ratio {pair[1] / pair[0]:.2f} > {RATIO_LIMIT}")
    return {
        "stream store": kind,
        "appends without / with": f"{len(without)} / {len(with_stall)}",
        "p50 ms without / with": f"{p50[0]:.2f} / {p50[1]:.2f}",
        "p50 ratio": round(p50[1] / p50[0], 2),
        "p99 ms without / with": f"{p99[0]:.2f} / {p99[1]:.2f}",
        "p99 ratio": round(p99[1] / p99[0], 2),
        "queued at the stall's end (server send / client receive)": f"{queued[0]:,} / {queued[1]:,} B",
        "writer blocked for (s)": round(stall_ended - blocked_since, 1) if blocked_since is not None else 0,
        "p50 / p99 ratio while blocked": (
            f"{percentile(blocked, 0.5) / p50[0]:.2f} / {percentile(blocked, 0.99) / p99[0]:.2f}" if blocked else "-"
        ),
        "stalled client": stalled_outcome,
        "healthy client": healthy_outcome,
    }


def _blocked_since(growth: list[tuple[float, int]]) -> float | None:
    """When the server's send queue to the stalled client stopped growing (its writes blocked)."""
    if not growth or max(size for _, size in growth) <= 0:
        return None
    full = max(size for _, size in growth)
    return next(at for at, size in growth if size >= 0.95 * full)


def _start_run(url: str, key: str) -> dict[str, str]:
    import requests

    response = requests.post(
        f"{url}/v1/workflows/run",
        json={"inputs": {"name": "slow"}, "user": "u1", "response_mode": "async"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    response.raise_for_status()
    body: dict[str, str] = response.json()
    return body


def _outcome(
    events: list[dict[str, Any]], error: dict[str, Any] | None, stored: list[dict[str, Any]], sealed: bool
) -> str:
    if error is not None and error.get("status") == 410:
        return "410"
    if error is not None:
        return f"error {error}"
    if not sealed:
        return "the run's topic was not sealed"
    if events == stored:
        return "every event"
    return f"{len(events)} events, {len(stored)} stored: not the same"


class StalledClient:
    """An SSE client on a socket with a small receive buffer that reads nothing until told to."""

    def __init__(self, port: int, key: str, task_id: str, receive_buffer: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Before connect(): the window the client advertises is fixed when the connection is set up.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.connect(("127.0.0.1", port))
        self.local_port = sock.getsockname()[1]
        self.server_port = port
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self._connection.sock = sock
        self._connection.request(
            "GET", f"/v1/workflow/{task_id}/events?user=u1", headers={"Authorization": f"Bearer {key}"}
        )
        self._response = self._connection.getresponse()  # the status line and headers only

    def queued(self) -> tuple[int, int]:
        """Bytes in the server's send queue and in this client's receive queue, as ``ss`` reports them."""
        return self._queue(self.server_port, self.local_port)[1], self._queue(self.local_port, self.server_port)[0]

    def watch_queue(self, until: float) -> list[tuple[float, int]]:
        """Sample the server's send queue to this client once a second until ``until``."""
        growth = []
        while (now := time.monotonic()) < until:
            growth.append((now, self.queued()[0]))
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        return growth

    @staticmethod
    def _queue(local: int, remote: int) -> tuple[int, int]:
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, IndexError):
            output = subprocess.run(
                ["ss", "-Htn", "state", "established", f"( sport = :{local} and dport = :{remote} )"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.split()
            return int(output[0]), int(output[1])
        return -1, -1

    def read_on(self) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """Read to the end of the response: the events, and an ``event: error`` body if one came."""
        events: list[dict[str, Any]] = []
        error = None
        if self._response.status != 200:
            body = json.loads(self._response.read() or b"{}")
            return events, body
        for message in parse_sse(iter(lambda: self._response.read1(1 << 16), b"")):
            if message.event == "error":
                error = message.json
            elif message.event is None:
                events.append(message.json)
        self._connection.close()
        return events, error
