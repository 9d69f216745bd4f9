"""SSE capacity of one API worker: N clients following ~40 concurrently streaming runs.

Run with ``.venv/bin/python -m bench.sse`` (``make bench``); ``--quick`` for a small run,
``--clients 500,1000,…`` for other sizes. For each N, the durable mode and the broadcast mode
(``EVENT_BUS_TRANSPORT=broadcast_channel``, ``pubsub``) are measured one after the other, each on a
fresh stack:

- a private ``redis-server`` (durable streams ``DURABLE_STREAM_URL=redis://…``, the broadcast
  channel's ``REDIS_URL`` and the Celery broker), SQLite app data;
- real ``gunicorn -k gevent`` with ONE worker (``--worker-connections`` raised so N fit) and one
  Celery worker (threads) running ``bench.sse_probe``: the real app, whose simulated LLM tokens carry
  the producer's ``time.time()`` (``pN@<stamp>``);
- ``--runs`` runs of start → human input (pause) → LLM (``--tokens`` probe tokens, ``--rate`` per
  second) → end. All runs are started and paused first; then N clients (``bench.sse_load``, several
  asyncio processes on raw sockets) follow them round-robin from their beginning via
  ``GET /v1/workflow/<task_id>/events?continue_on_pause=true&include_state_snapshot=true``;
- **idle**: with every client connected to a paused run, the worker's CPU share over ``--idle`` s;
- **streaming**: every run's form is submitted (``POST /v1/form/human_input/<form_token>``) at once;
  clients read until ``workflow_finished``.

Per row: latency (client receive - producer stamp) p50/p99/max, the worker's CPU µs per delivered
probe event (its CPU time over the streaming phase / deliveries), its RSS growth per connection
(connected - before), the Redis connections (all of the private server's, and the API worker's
own), errors (non-200 answers, failed connections, broken or unfinished streams, missing or
duplicated probe events, 5xx in the access log) and deliveries received/expected, and the load
processes' own CPU (the busiest one, as a share of one core), to show the clients kept up.

The table is printed; figures go to ``bench/results/sse-<date>.json`` and the charts (p99 and CPU per
delivery against N) to ``docs/images/sse-capacity-*.png``.

**Herds and deploys** (issue 28; ``--scenario herd|deploy``, the code in ``bench/sse_herd.py`` and
``bench/sse_herd_load.py``, whose docstrings define every figure): the runs are already streaming
(``--rate`` probe tokens a second, default 1, long enough to outlast the measurement) when the
clients arrive open loop at ``--arrival-rate`` a second and start as ``--start`` says
(``bench/sse_starts.py``): ``tail`` (neither ``Last-Event-ID`` nor ``include_state_snapshot``: Dify's
default reader, which its web front end sends on every reconnect), ``cursor`` (``Last-Event-ID`` of a
real event from the middle of their run), ``snapshot`` (``include_state_snapshot=true``: the run from
its start), or a mix: ``mix`` (the default, Dify's: half tail, a quarter cursor, a quarter snapshot) or
shares such as ``tail=50,cursor=25,snapshot=25``. Clients honour ``503`` + ``Retry-After``, reconnect
a stream that ends without ``workflow_finished`` (after the server's ``retry:``; with
``Last-Event-ID``, except tail clients, which ask for the tail again as Dify's front end does), and
check exactly once over all their streams. ``herd`` (``--workers`` default 1) reports the time from a
client's first attempt to being level with its run's live tail and append → client once level;
``deploy`` (``--workers`` default 4) then ``kill -HUP``s the master and SIGKILLs one worker
(``--events hup,kill``, ``--gap`` s apart) and reports, per event, the time from each affected
stream's end to level again. For example::

    python -m bench.sse --scenario herd --clients 10000 --arrival-rate 1000
    python -m bench.sse --scenario herd --clients 10000 --arrival-rate 1000 --start tail
    python -m bench.sse --scenario herd --clients 2000 --arrival-rate 400 --start snapshot   # issue 28's observation
    python -m bench.sse --scenario herd --clients 20000 --arrival-rate 2000 --start tail     # overload
    python -m bench.sse --scenario deploy --clients 10000 --workers 4

Results go to ``bench/results/sse-<date>-<scenario or --tag>.json``; the herd's chart (the share of
clients level against time) to ``docs/images/sse-herd-time-to-level.png`` (``--chart-from`` redraws it
from several results files).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import requests

from harness.postgres_server import PostgresServer
from harness.processes import ROOT
from harness.redis_server import RedisServer
from harness.served_stack import ServedStack

from . import sse_herd
from .common import percentile
from .soak.report import machine
from .sse_stack import USER, raise_open_files, stack_env, start_load_processes
from .sse_starts import parse_start, start_label

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
IMAGES = ROOT / "docs" / "images"
MODES = ("durable", "broadcast")
FULL_CLIENTS = (500, 1000, 2000, 5000, 10000)
QUICK_CLIENTS = (200, 500)


def probe_workflow(tokens: int, rate: float) -> dict[str, Any]:
    """start → human input (the run pauses) → LLM streaming ``tokens`` probe tokens at ``rate``/s → end."""
    return {
        "name": f"SSE capacity probe: {tokens} tokens at {rate:g}/s",
        "mode": "workflow",
        "graph": {
            "nodes": [
                {"id": "start", "type": "start", "variables": [{"name": "name", "required": True}]},
                {
                    "id": "approve",
                    "type": "human_input",
                    "form": [{"name": "approved", "type": "select", "options": ["true", "false"]}],
                },
                {
                    "id": "llm",
                    "type": "llm",
                    "prompt": "Probe {{start.name}}",
                    "response": " ".join(f"p{index}" for index in range(tokens)),
                    "token_delay": 1.0 / rate,
                },
                {"id": "end", "type": "end", "outputs": {"text": {"variable": "llm.text"}}},
            ],
            "edges": [
                {"source": "start", "target": "approve"},
                {"source": "approve", "target": "llm"},
                {"source": "llm", "target": "end"},
            ],
        },
    }


def request_snapshot(directory: pathlib.Path, name: str, timeout: float = 120) -> None:
    """Have the profiled worker write ``<directory>/<name>.snapshot`` (tools/profile_worker_conf.py)."""
    (directory / f"{name}.request").touch()
    deadline = time.monotonic() + timeout
    while (directory / f"{name}.request").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker wrote no {name} snapshot")
        time.sleep(0.2)


def _post(url: str, path: str, key: str, body: dict[str, Any], timeout: float = 30) -> requests.Response:
    return requests.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)


@dataclasses.dataclass(frozen=True)
class PausedRun:
    task_id: str
    workflow_run_id: str
    #: The open form's token and the action it is submitted with.
    form_token: str
    action: str


def start_paused_runs(url: str, key: str, runs: int, timeout: float = 120) -> list[PausedRun]:
    """Start ``runs`` runs in blocking mode: each is answered once it pauses, with its open form."""
    started = []
    for index in range(runs):
        answer = _post(
            url,
            "/v1/workflows/run",
            key,
            {"inputs": {"name": f"r{index}"}, "user": USER, "response_mode": "blocking"},
            timeout,
        )
        answer.raise_for_status()
        body = answer.json()
        data = body["data"]
        if data.get("status") != "paused" or not data.get("reasons"):
            raise RuntimeError(f"run {body['workflow_run_id']} did not pause: {data.get('status')}")
        (reason,) = data["reasons"]
        action = reason["actions"][0]["id"]
        started.append(PausedRun(body["task_id"], body["workflow_run_id"], reason["form_token"], action))
    return started


def resume_runs(url: str, key: str, runs: list[PausedRun], spread: float = 0.0) -> None:
    """Submit every run's form, the i-th ``i / len(runs) * spread`` seconds after the first (0: all at once)."""
    started = time.monotonic()

    def resume(index: int, run: PausedRun) -> None:
        delay = started + index / len(runs) * spread - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = {"inputs": {"approved": "true"}, "action": run.action, "user": USER}
        answer = _post(url, f"/v1/form/human_input/{run.form_token}", key, body)
        answer.raise_for_status()

    threads = [threading.Thread(target=resume, args=(index, run)) for index, run in enumerate(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def redis_connections(redis: RedisServer, worker_pid: int) -> tuple[int, int]:
    """(every client of the private server, the API worker's own connections to it)."""
    total = sum(1 for line in redis.cli("CLIENT", "LIST").splitlines() if line.startswith("id="))
    own = sum(
        1
        for connection in psutil.Process(worker_pid).net_connections(kind="tcp")
        if connection.raddr and connection.raddr.port == redis.port
    )
    return total, own


class LoadProcesses:
    """``processes`` ``bench.sse_load`` children sharing the clients; their CPU is watched."""

    def __init__(self, job: dict[str, Any], task_ids: list[str], processes: int) -> None:
        self.children = start_load_processes("bench.sse_load", job, "task_ids", task_ids, processes)
        self.processes = [psutil.Process(child.pid) for child in self.children]

    def read(self) -> list[dict[str, Any]]:
        lines = []
        for child in self.children:
            assert child.stdout is not None
            line = child.stdout.readline()
            lines.append(json.loads(line) if line else {"error": f"load process {child.pid} exited"})
        return lines

    def cpu(self) -> list[float]:
        times = []
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                cpu = process.cpu_times()
                times.append(cpu.user + cpu.system)
        return times

    def close(self) -> None:
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.wait(timeout=10)
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(
    mode: str,
    clients: int,
    *,
    runs: int = 40,
    tokens: int = 10,
    rate: float = 0.5,
    idle_seconds: float = 20.0,
    load_processes: int = 4,
    lockstep: bool = False,
    profile_dir: pathlib.Path | None = None,
    streams: str = "redis",
    directory: pathlib.Path | None = None,
    extra_env: dict[str, str] | None = None,
    access_log: bool = True,
) -> dict[str, Any]:
    """One row: a fresh stack, ``clients`` clients over ``runs`` paused runs, idle, then streaming."""
    raise_open_files()
    with contextlib.ExitStack() as stack:
        tmp = directory or pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sse-")))
        redis = stack.enter_context(RedisServer(extra=["--maxclients", str(clients * 2 + 1000)]))
        stream_url = None
        if streams == "postgres":
            stream_url = stack.enter_context(PostgresServer()).url
        elif streams == "sqlite":
            stream_url = f"sqlite:///{tmp / 'streams.db'}"
        env = stack_env(tmp / "var", redis, mode, clients, extra_env, stream_url)
        if profile_dir is not None:
            env["PROFILE_WORKER_DIR"] = str(profile_dir / f"{mode}-{clients}")
        served = stack.enter_context(
            ServedStack(
                env,
                tmp / "stack",
                servers=1,
                workers_per_server=1,
                celery_concurrency=runs + 8,
                server_args=[
                    *("--worker-connections", str(clients + 1000), "--backlog", "4096"),
                    *(() if profile_dir is None else ("--config", "python:tools.profile_worker_conf")),
                ],
                celery_app="bench.sse_probe:celery",
                access_log=access_log,
            )
        )
        server = served.servers[0]
        url = server.url
        worker = psutil.Process(server.worker_pids()[0])
        key = served.create_app(probe_workflow(tokens, rate))
        started = start_paused_runs(url, key, runs)
        task_ids = [started[index % runs].task_id for index in range(clients)]

        snapshots = env.get("PROFILE_WORKER_DIR") if env.get("PROFILE_WORKER_TRACEMALLOC") else None
        if snapshots:
            request_snapshot(pathlib.Path(snapshots), "before")
        rss_before = worker.memory_info().rss
        stream_seconds = tokens / rate
        job = {
            "host": "127.0.0.1",
            "port": server.port,
            "key": key,
            "user": USER,
            "tokens": tokens,
            "connect_concurrency": 64,
            "deadline_s": 120 + clients / 50 + idle_seconds + stream_seconds * 3,
        }
        load = LoadProcesses(job, task_ids, load_processes)
        stack.callback(load.close)
        connect_started = time.monotonic()
        ready = load.read()
        connect_seconds = time.monotonic() - connect_started
        connected = sum(part.get("ok", 0) for part in ready)

        # Idle: every client waits on a paused run.
        time.sleep(1.0)
        rss_connected = worker.memory_info().rss
        if snapshots:
            request_snapshot(pathlib.Path(snapshots), "connected")
        redis_total, redis_worker = redis_connections(redis, worker.pid)
        idle_cpu_before, idle_wall_before = _cpu(worker), time.monotonic()
        time.sleep(idle_seconds)
        idle_share = (_cpu(worker) - idle_cpu_before) / max(1e-9, time.monotonic() - idle_wall_before)

        # Streaming: resume every run at once.
        load_cpu_before = load.cpu()
        cpu_before, wall_before = _cpu(worker), time.monotonic()
        system_before = worker.cpu_times().system
        # Independent runs do not emit their tokens in the same millisecond: resumed one after the
        # other over one token interval, their probes arrive evenly. --lockstep resumes all at once,
        # so every token interval starts with a burst of runs x clients-per-run deliveries.
        resume_runs(url, key, started, spread=0.0 if lockstep else 1.0 / rate)
        done = load.read()
        stream_wall = time.monotonic() - wall_before
        worker_cpu = _cpu(worker) - cpu_before
        worker_system = worker.cpu_times().system - system_before
        load_cpu = [after - before for before, after in zip(load_cpu_before, load.cpu(), strict=False)]

        latencies = [tenths / 10 for part in done for tenths in part.get("latencies", [])]
        by_probe: dict[int, list[float]] = {}
        for part in done:
            for index, values in part.get("by_probe", {}).items():
                by_probe.setdefault(int(index), []).extend(tenths / 10 for tenths in values)
        closes = [tenths / 10 for part in done for tenths in part.get("close_delays", [])]
        received = sum(part.get("received", 0) for part in done)
        events = sum(part.get("events", 0) for part in done)
        statuses: dict[str, int] = {}
        for part in done:
            for status, count in part.get("statuses", {}).items():
                statuses[status] = statuses.get(status, 0) + count
        errors = {
            "http": sum(count for status, count in statuses.items() if status != "200"),
            "connect": sum(part.get("connect_errors", 0) for part in done),
            "broken": sum(part.get("broken", 0) for part in done),
            "unfinished": sum(part.get("unfinished", 0) for part in done),
            "unclosed": sum(part.get("unclosed", 0) for part in done),
            "missing": sum(part.get("missing", 0) for part in done),
            "duplicated": sum(part.get("duplicated", 0) for part in done),
            "out_of_order": sum(part.get("out_of_order", 0) for part in done),
            "server_5xx": sum(count for status, count in served.statuses().items() if status >= 500),
            "load_process": sum(1 for part in done if "error" in part),
        }
        return {
            "mode": mode,
            "streams": streams if mode == "durable" else "redis pub/sub",
            "clients": clients,
            "runs": runs,
            "tokens": tokens,
            "rate_per_run": rate,
            "connected": connected,
            "connect_seconds": round(connect_seconds, 1),
            "statuses": statuses,
            "p50_ms": round(percentile(latencies, 0.5), 1),
            "p99_ms": round(percentile(latencies, 0.99), 1),
            "max_ms": round(max(latencies), 1) if latencies else float("nan"),
            # Probe 0 of a run is its first event after the resume: where a resume burst shows.
            "p99_ms_by_probe": [round(percentile(by_probe[index], 0.99), 1) for index in sorted(by_probe)],
            "last_probe_ms_p50_p90_p95_p99": [
                round(percentile(by_probe[max(by_probe)], q), 1) for q in (0.5, 0.9, 0.95, 0.99)
            ]
            if by_probe
            else [],
            # From a client's workflow_finished to the server closing its stream.
            "close_ms_p50_p99_max": [round(percentile(closes, q), 1) for q in (0.5, 0.99)] + [round(max(closes), 1)]
            if closes
            else [],
            # Every event the streaming phase delivered (the probes and the resumed runs' other events).
            "cpu_us_per_delivery": round(worker_cpu / events * 1e6, 1) if events else float("nan"),
            "kernel_share_of_cpu": round(worker_system / worker_cpu, 2) if worker_cpu else float("nan"),
            "cpu_us_per_probe": round(worker_cpu / received * 1e6, 1) if received else float("nan"),
            "events": events,
            "lockstep": lockstep,
            "access_log": access_log,
            "worker_cpu_share_streaming": round(worker_cpu / stream_wall, 3),
            "stream_seconds": round(stream_wall, 1),
            "rss_per_connection_kb": round((rss_connected - rss_before) / 1024 / max(1, connected), 1),
            "rss_before_mb": round(rss_before / 2**20, 1),
            "rss_connected_mb": round(rss_connected / 2**20, 1),
            "redis_connections": redis_total,
            "redis_connections_worker": redis_worker,
            "idle_seconds": idle_seconds,
            "idle_cpu_share": round(idle_share, 3),
            "errors": errors,
            "error_count": sum(errors.values()),
            "received": received,
            "expected": clients * tokens,
            "load_processes": len(load_cpu),
            "load_cpu_share_max": round(max(load_cpu) / stream_wall, 3) if load_cpu else float("nan"),
            "worker_timeouts": served.worker_timeouts(),
        }


COLUMNS = (
    ("clients", "clients"),
    ("mode", "mode"),
    ("streams", "streams"),
    ("p50 ms", "p50_ms"),
    ("p99 ms", "p99_ms"),
    ("max ms", "max_ms"),
    ("CPU µs/delivery", "cpu_us_per_delivery"),
    ("CPU µs/probe", "cpu_us_per_probe"),
    ("worker CPU", "worker_cpu_share_streaming"),
    ("RSS/conn KB", "rss_per_connection_kb"),
    ("Redis conns (worker)", "redis"),
    ("idle CPU", "idle_cpu_share"),
    ("errors", "error_count"),
    ("received/expected", "deliveries"),
    ("load CPU max", "load_cpu_share_max"),
)


def _cells(row: dict[str, Any]) -> list[str]:
    if "failed" in row:
        return [str(row["clients"]), row["mode"], f"failed: {row['failed']}"] + [""] * (len(COLUMNS) - 3)
    values = {
        "streams": "redis" if row["mode"] == "durable" else "redis pub/sub",
        "cpu_us_per_probe": "",
        **row,
        "redis": f"{row['redis_connections']} ({row['redis_connections_worker']})",
        "deliveries": f"{row['received']:,}/{row['expected']:,}",
        "clients": f"{row['clients']:,}",
    }
    for name in ("worker_cpu_share_streaming", "idle_cpu_share", "load_cpu_share_max"):
        values[name] = f"{row[name]:.0%}"
    return [str(values[key]) for _, key in COLUMNS]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(title for title, _ in COLUMNS) + " |", "|" + "|".join("---:" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def error_details(rows: list[dict[str, Any]]) -> list[str]:
    notes = []
    for row in rows:
        if "failed" in row:
            notes.append(f"{row['clients']} {row['mode']}: {row['failed']}")
        elif row["error_count"]:
            kinds = ", ".join(f"{name} {count}" for name, count in row["errors"].items() if count)
            notes.append(f"{row['clients']} {row['mode']}: {kinds} (statuses {row['statuses']})")
    return notes


def charts(rows: list[dict[str, Any]], directory: pathlib.Path = IMAGES) -> list[pathlib.Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for key, label, name, log_y in (
        ("p99_ms", "p99 latency, append → client (ms)", "sse-capacity-p99.png", True),
        ("cpu_us_per_delivery", "API worker CPU per delivered event (µs)", "sse-capacity-cpu.png", False),
    ):
        figure, axes = plt.subplots(figsize=(6, 4))
        for mode in MODES:
            points = [
                (row["clients"], row[key])
                for row in rows
                if row["mode"] == mode and "failed" not in row and row.get("received")
            ]
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", label=mode)
        axes.set_xscale("log")
        if log_y:
            axes.set_yscale("log")
        axes.set_title("rows with errors included; see the table", fontsize=8)
        axes.set_xlabel("SSE clients on one gunicorn gevent worker")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
        figure.tight_layout()
        path = directory / name
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written


@contextlib.contextmanager
def _timer() -> Iterator[dict[str, float]]:
    box = {"started": time.monotonic()}
    yield box
    box["seconds"] = time.monotonic() - box["started"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", help="comma-separated N (default 500,1000,2000,5000,10000)")
    parser.add_argument("--quick", action="store_true", help="a small run: N=200,500, short idle")
    parser.add_argument("--modes", default=",".join(MODES), help="durable,broadcast")
    parser.add_argument("--runs", type=int, default=40, help="concurrently streaming runs (default 40)")
    parser.add_argument("--tokens", type=int, default=10, help="probe events per run (default 10)")
    parser.add_argument(
        "--rate", type=float, default=None, help="probe events per second per run (default 0.5; herd/deploy 1)"
    )
    parser.add_argument("--idle", type=float, default=None, help="seconds of the idle measurement (default 20)")
    parser.add_argument("--load-processes", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE app setting for the stack (repeatable)")
    parser.add_argument(
        "--lockstep", action="store_true", help="resume every run at once (bursts), not spread over a token interval"
    )
    parser.add_argument(
        "--profile-worker",
        type=pathlib.Path,
        metavar="DIR",
        help="cProfile the API workers in 20 s windows into DIR (tools/profile_worker_conf.py), in every "
        "scenario; slows them down",
    )
    parser.add_argument(
        "--streams",
        choices=("redis", "postgres", "sqlite"),
        default="redis",
        help="the durable mode's stream store: the private Redis, a private PostgreSQL, or an SQLite file",
    )
    parser.add_argument("--no-charts", action="store_true")
    parser.add_argument(
        "--no-access-log",
        action="store_true",
        help="serve without gunicorn's access log, as bin/run and compose do (5xx then counted by the clients only)",
    )
    parser.add_argument("--tag", default="", help="suffix of the results file (sse-<date>-<tag>.json)")
    herd = parser.add_argument_group("herds and deploys (--scenario herd|deploy; see bench/sse_herd.py)")
    herd.add_argument(
        "--scenario",
        choices=("capacity", "herd", "deploy"),
        default="capacity",
        help="capacity (the default: clients on paused runs), herd (clients arrive on streaming runs) or deploy",
    )
    herd.add_argument("--arrival-rate", type=float, default=1000.0, help="clients arriving per second (open loop)")
    herd.add_argument("--workers", type=int, default=None, help="gunicorn gevent workers (herd 1, deploy 4)")
    herd.add_argument(
        "--start",
        type=parse_start,
        default="mix",
        help="where clients start: tail, cursor, snapshot, mix (default: Dify's, tail=50,cursor=25,snapshot=25) "
        "or shares such as tail=80,snapshot=20",
    )
    herd.add_argument("--warmup", type=float, default=20.0, help="seconds the runs stream before the first client")
    herd.add_argument("--level-wait", type=float, default=20.0, help="seconds after the arrival to wait for level")
    herd.add_argument("--steady", type=float, default=None, help="seconds of steady streaming (herd 20, deploy 10)")
    herd.add_argument("--events", default="hup,kill", help="deploy: the events in order (hup, kill)")
    herd.add_argument("--gap", type=float, default=25.0, help="deploy: seconds after each event")
    herd.add_argument(
        "--reconnect-ms", type=float, default=500.0, help="a client's reconnection time until a retry: sets one"
    )
    herd.add_argument(
        "--chart-from",
        nargs="+",
        type=pathlib.Path,
        metavar="JSON",
        help="draw the herd chart from these results files' rows, measure nothing",
    )
    args = parser.parse_args(argv)
    if args.chart_from or args.scenario != "capacity":
        herd_main(args, argv)
        return
    if args.rate is None:
        args.rate = 0.5

    clients = (
        [int(n) for n in args.clients.split(",")]
        if args.clients
        else list(QUICK_CLIENTS if args.quick else FULL_CLIENTS)
    )
    idle = args.idle if args.idle is not None else (5.0 if args.quick else 20.0)
    modes = [mode for mode in args.modes.split(",") if mode]
    extra_env = dict(item.split("=", 1) for item in args.env)
    hard = raise_open_files()
    info = machine()
    info["open_files_limit"] = hard
    print(
        f"SSE capacity, one gunicorn gevent worker: clients {clients}, modes {modes}, {args.runs} runs x "
        f"{args.tokens} probe events at {args.rate:g}/s, idle {idle:g} s; {info['nproc']} CPUs, nofile {hard}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    with _timer() as timer:
        for count in clients:
            for mode in modes:
                try:
                    row = measure(
                        mode,
                        count,
                        runs=args.runs,
                        tokens=args.tokens,
                        rate=args.rate,
                        idle_seconds=idle,
                        lockstep=args.lockstep,
                        profile_dir=args.profile_worker,
                        streams=args.streams,
                        load_processes=args.load_processes,
                        extra_env=extra_env,
                        access_log=not args.no_access_log,
                    )
                except Exception as exc:  # one size failing must not lose the others
                    row = {"mode": mode, "clients": count, "failed": f"{type(exc).__name__}: {exc}"[:300]}
                rows.append(row)
                print(" | ".join(_cells(row)), flush=True)
    print()
    print(markdown_table(rows))
    for note in error_details(rows):
        print(f"- {note}")
    results = {
        "machine": info,
        "command": " ".join(["python -m bench.sse", *(argv if argv is not None else sys.argv[1:])]),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "env": extra_env,
        "options": {
            "runs": args.runs,
            "tokens": args.tokens,
            "rate": args.rate,
            "idle": idle,
            "load_processes": args.load_processes,
        },
        "rows": rows,
        "seconds": round(timer.get("seconds", 0.0), 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.tag}" if args.tag else ("-quick" if args.quick else "")
    path = RESULTS / f"sse-{datetime.date.today().isoformat()}{suffix}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")
    if not args.no_charts and not args.quick and not args.tag:
        for chart in charts(rows):
            print(f"chart: {chart.relative_to(ROOT)}")


def herd_main(args: argparse.Namespace, argv: list[str] | None) -> None:
    """``--scenario herd|deploy`` (and ``--chart-from``): rows of ``bench.sse_herd.measure_scenario``."""
    if args.chart_from:
        drawn = [
            {**row, "source": path.stem.removeprefix("sse-")}  # which run each line is, in its legend
            for path in args.chart_from
            for row in json.loads(path.read_text())["rows"]
            if "error" not in row
        ]
        print(f"chart: {sse_herd.herd_chart(drawn, IMAGES / 'sse-herd-time-to-level.png').relative_to(ROOT)}")
        return
    scenario = args.scenario
    workers = args.workers or (4 if scenario == "deploy" else 1)
    steady = args.steady if args.steady is not None else (10.0 if scenario == "deploy" else 20.0)
    rate = args.rate if args.rate is not None else 1.0
    counts = [int(n) for n in args.clients.split(",")] if args.clients else [1000 if args.quick else 10000]
    events = tuple(name for name in args.events.split(",") if name)
    extra_env = dict(item.split("=", 1) for item in args.env)
    hard = raise_open_files()
    info = machine()
    info["open_files_limit"] = hard
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--short", "api/"], cwd=ROOT, capture_output=True, text=True
    ).stdout.splitlines()
    print(
        f"SSE {scenario}: clients {counts} at {args.arrival_rate:g}/s, {workers} worker(s), {args.runs} runs at "
        f"{rate:g} probe/s, start {start_label(args.start)}; {info['nproc']} CPUs; code {commit[:7]}"
        f"{' + uncommitted api/ changes' if dirty else ''}",
        flush=True,
    )
    for count in counts:
        if count / workers + 1000 > hard:
            # Each worker holds its clients' sockets under the same hard limit: past it, it cannot accept.
            print(
                f"note: {count:,} clients on {workers} worker(s) is more sockets per worker than the "
                f"open-files limit ({hard:,}) allows; the rest must be refused (503) or fail to connect",
                flush=True,
            )
    rows: list[dict[str, Any]] = []
    with _timer() as timer:
        for count in counts:
            try:
                row = sse_herd.measure_scenario(
                    scenario,
                    count,
                    arrival_rate=args.arrival_rate,
                    workers=workers,
                    runs=args.runs,
                    rate=rate,
                    start=args.start,
                    warmup=args.warmup,
                    level_wait=args.level_wait,
                    steady=steady,
                    events=events,
                    gap=args.gap,
                    load_processes=args.load_processes,
                    reconnect_ms=args.reconnect_ms,
                    extra_env=extra_env,
                    access_log=not args.no_access_log,
                    profile_dir=args.profile_worker,
                )
            except Exception as exc:  # one size failing must not lose the others
                row = {"scenario": scenario, "clients": count, "error": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(row)
            print(" | ".join(sse_herd.herd_cells(row)), flush=True)
    print()
    print(sse_herd.markdown_tables(rows))
    results = {
        "machine": info,
        "command": " ".join(["python -m bench.sse", *(argv if argv is not None else sys.argv[1:])]),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "api_changes": dirty,
        "env": extra_env,
        "rows": rows,
        "seconds": round(timer.get("seconds", 0.0), 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.tag}" if args.tag else f"-{scenario}"
    path = RESULTS / f"sse-{datetime.date.today().isoformat()}{suffix}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")
    if scenario == "herd" and not args.no_charts:
        print(f"chart: {sse_herd.herd_chart(rows, IMAGES / 'sse-herd-time-to-level.png').relative_to(ROOT)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
