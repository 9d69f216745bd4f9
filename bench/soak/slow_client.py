"""Scenario 5: one SSE client stops reading for a minute while its run streams.

A producer process (as a Celery worker would be) appends the events of two runs through the
library, alternately, at a fixed rate each, and times every append: the *stalled* run and a
*control* run. A healthy client reads each run throughout. After ``before`` seconds a second
client of the stalled run connects through the other gunicorn server with a small receive buffer
(``SO_RCVBUF``) and then reads nothing for ``stall`` seconds: once the socket buffers are full the
server's writes to it block. The target: the stalled run's append latency during the stall, p50
and p99, at most 1.2 times the control run's over the same seconds. Interleaving the two runs'
appends is what makes this measurable on a shared machine: the same stall measured against the
seconds before and after it (reported too) moves by more than 20 % between runs even with no
stalled client at all. Afterwards the stalled client reads on and must get every event of its run
(or a 410); the healthy clients must get every event of theirs.
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
from bench.common import percentile
from harness.processes import ROOT, process_env
from harness.served_stack import ServedStack
from harness.sse import parse_sse
from harness.sse_client import Connection, read_run

from .report import Table
from .services import Services, stream_store
from .stack import server_problems, soak_env, stored_events
from .workflows import streaming_workflow

STORES = ("sqlite", "redis", "postgres")
RATIO_LIMIT = 1.2
STALLED, CONTROL = 0, 1
COLUMNS = [
    "stream store",
    "appends per run in the stall",
    "p50 ms stalled run / control",
    "p50 ratio",
    "p99 ms stalled run / control",
    "p99 ratio",
    "writer blocked for (s)",
    "p50 / p99 ratio while blocked",
    "p50 / p99 ratio, stall vs before + after",
    "queued at the stall's end (server send / client receive)",
    "stalled client",
    "healthy clients",
]


@dataclasses.dataclass
class SlowClientOptions:
    stores: Sequence[str] = STORES
    #: Appends per second to each of the two runs.
    rate: float = 50.0
    before: float = 20.0
    stall: float = 60.0
    after: float = 20.0
    #: Left out of the "before + after" samples: the stalled client catching up on what it missed.
    catch_up: float = 3.0
    #: Left out of every sample: the producer opening its connections.
    warm_up: float = 2.0
    receive_buffer: int = 4096


def run(found: Services, directory: pathlib.Path, options: SlowClientOptions) -> Table:
    table = Table(
        "slow-client",
        f"Slow client: one client reads nothing for {options.stall:g} s while its run streams",
        COLUMNS,
        settings={"appends /s per run": options.rate, "SO_RCVBUF": options.receive_buffer},
        notes=[
            "A producer process appends ~2 KB events to two runs' topics, alternately: the stalled client's "
            "run and a control run (each with a healthy reader). The ratios are the stalled run's latency "
            f"over the control run's during the stall; target ≤ {RATIO_LIMIT}.",
            "'writer blocked for': the part of the stall after the server's send queue to the stalled client "
            "stopped growing (its writes blocked); 'while blocked' ratios are over that part only.",
            f"'stall vs before + after': the stalled run during the stall over the same run in the "
            f"{options.before:g} s before it and the {options.after:g} s after it (less "
            f"{options.catch_up:g} s of catching up): a view over time, for effects that would slow every "
            "topic of the store alike; on this shared machine it varies by ±20 % (p50) and ±50 % (p99) "
            "between runs even without a stalled client.",
            "'queued': bytes in the server's send queue and the stalled client's receive queue (`ss`) when "
            "the stall ended.",
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
        # No Celery worker consumes the runs' tasks: the producer process writes the runs' events.
        # The start deadline is off so that nobody ends the runs meanwhile.
        env = soak_env(directory / "var", found, stream_url, WORKFLOW_START_TIMEOUT=0)
        with ServedStack(env, directory, servers=2, workers_per_server=1, celery_workers=0) as stack:
            key = stack.create_app(streaming_workflow(1, 0))
            runs = [_start_run(stack.urls[0], key) for _ in (STALLED, CONTROL)]
            healthy: dict[int, Connection] = {}
            readers = [
                threading.Thread(target=_read_into, args=(healthy, index, stack.urls[0], key, run["task_id"]))
                for index, run in enumerate(runs)
            ]
            for reader in readers:
                reader.start()
            samples_path = directory / "samples.json"
            producer = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.soak.producer",
                    f"--url={stream_url}",
                    *(
                        f"--run={workflow_run_topic('workflow', run['workflow_run_id'])},{run['task_id']},"
                        f"{run['workflow_run_id']}"
                        for run in runs
                    ),
                    f"--rate={options.rate}",
                    f"--duration={options.before + options.stall + options.after}",
                    f"--out={samples_path}",
                ],
                cwd=ROOT,
                env=process_env(env),
            )
            try:
                time.sleep(options.before)  # no stalled client yet
                stall_began = time.monotonic()
                stalled = StalledClient(stack.servers[1].port, key, runs[STALLED]["task_id"], options.receive_buffer)
                queue_growth = stalled.watch_queue(stall_began + options.stall)
                queued = stalled.queued()
                stall_ended = time.monotonic()
                stalled_events, stalled_error = stalled.read_on()
                if producer.wait(timeout=options.after + 120) != 0:
                    table.problems.append(f"{kind}: the producer failed (exit {producer.returncode})")
            finally:
                if producer.poll() is None:
                    producer.kill()
            for reader in readers:
                reader.join(timeout=60)
            table.problems.extend(server_problems(kind, stack)[1])
        samples = json.loads(samples_path.read_text())["samples"]
        with connect(stream_url) as backend:
            stored = [stored_events(backend, run["workflow_run_id"]) for run in runs]
    samples = [s for s in samples if s[1] >= samples[0][1] + options.warm_up]

    def latencies(run: int, begin: float, end: float) -> list[float]:
        return [s[2] * 1000 for s in samples if s[0] == run and begin <= s[1] < end]

    stalled_ms, control_ms = latencies(STALLED, stall_began, stall_ended), latencies(CONTROL, stall_began, stall_ended)
    blocked_since = _blocked_since(queue_growth)
    blocked = (
        (latencies(STALLED, blocked_since, stall_ended), latencies(CONTROL, blocked_since, stall_ended))
        if blocked_since is not None
        else ([], [])
    )
    outside = latencies(STALLED, 0, stall_began) + latencies(STALLED, stall_ended + options.catch_up, float("inf"))
    p50 = (percentile(stalled_ms, 0.5), percentile(control_ms, 0.5))
    p99 = (percentile(stalled_ms, 0.99), percentile(control_ms, 0.99))
    outcomes = [_outcome(stalled_events, stalled_error, *stored[STALLED])]
    outcomes += [
        _outcome([item.event for item in healthy[index].events], None, *stored[index]) if index in healthy else "none"
        for index in (STALLED, CONTROL)
    ]
    for name, outcome in zip(("stalled", "healthy (stalled run)", "healthy (control run)"), outcomes, strict=True):
        if outcome not in ("every event", "410"):
            table.problems.append(f"{kind}: the {name} client: {outcome}")
    for name, (ours, theirs) in (("p50", p50), ("p99", p99)):
        if ours / theirs > RATIO_LIMIT:
            table.problems.append(f"{kind}: {name} append latency ratio {ours / theirs:.2f} > {RATIO_LIMIT}")
    return {
        "stream store": kind,
        "appends per run in the stall": len(stalled_ms),
        "p50 ms stalled run / control": f"{p50[0]:.2f} / {p50[1]:.2f}",
        "p50 ratio": round(p50[0] / p50[1], 2),
        "p99 ms stalled run / control": f"{p99[0]:.2f} / {p99[1]:.2f}",
        "p99 ratio": round(p99[0] / p99[1], 2),
        "writer blocked for (s)": round(stall_ended - blocked_since, 1) if blocked_since is not None else 0,
        "p50 / p99 ratio while blocked": _ratios(*blocked),
        "p50 / p99 ratio, stall vs before + after": _ratios(stalled_ms, outside),
        "queued at the stall's end (server send / client receive)": f"{queued[0]:,} / {queued[1]:,} B",
        "stalled client": outcomes[0],
        "healthy clients": " / ".join(outcomes[1:]),
    }


def _ratios(ours: list[float], theirs: list[float]) -> str:
    if not ours or not theirs:
        return "-"
    p50 = percentile(ours, 0.5) / percentile(theirs, 0.5)
    p99 = percentile(ours, 0.99) / percentile(theirs, 0.99)
    return f"{p50:.2f} / {p99:.2f}"


def _read_into(into: dict[int, Connection], index: int, url: str, key: str, task_id: str) -> None:
    into[index] = read_run(url, key, task_id)


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
    """``every event``, ``410``, or what went wrong, for a client that read a run from its beginning."""
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
            "GET",
            f"/v1/workflow/{task_id}/events?user=u1&include_state_snapshot=true",
            headers={"Authorization": f"Bearer {key}"},
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
