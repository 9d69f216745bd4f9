"""Herds and deploys: ``python -m bench.sse --scenario herd|deploy`` (issue 28).

Unlike the capacity mode (clients connect to paused runs, then the runs stream), here the runs are
**already streaming** when the clients arrive, and the clients arrive **open loop** at
``--arrival-rate`` a second, whatever the server does:

- a private ``redis-server`` (Redis streams, Celery broker), SQLite app data, real ``gunicorn -k
  gevent`` with ``--workers`` workers (``--config python:api.gunicorn_conf``, ``--worker-connections
  N+1000``, ``--backlog 4096``) and one Celery worker (``runs + 8`` threads) running ``bench.sse_probe``;
- ``--runs`` runs of start → LLM (probe tokens ``pN@<producer time.time()>``, ``--rate`` a second) →
  end, started one after the other over one token interval and long enough to outlast the
  measurement; after ``--warmup`` seconds each run has streamed part of its tokens;
- then one reader per run reads it from its start up to its live tail, which gives real event ids;
  each client starts as ``--start`` says (``bench/sse_starts.py``; default Dify's mix: half ``tail``,
  a quarter ``cursor``, a quarter ``snapshot``, assigned deterministically and interleaved over the
  runs and the arrival order): a ``cursor`` client gets ``Last-Event-ID`` of a probe event picked at
  random from the middle half of what its run had at that moment, a ``snapshot`` client uses
  ``include_state_snapshot=true`` and replays its run from its start, a ``tail`` client sends neither
  and reads from the live tail (and reconnects the same way, without a cursor);
- the clients (``bench.sse_herd_load``; their definitions of exactly once, of being **level with the
  live tail** and of their retries are in its docstring) start at ``i / arrival-rate`` s, round robin
  over the runs, and read until ``workflow_finished``.

``herd``: the figures of the arrival: time from a client's first attempt to level (p50/p99/max),
then append → client while level. ``deploy``: once every client is level (or after a bounded wait)
and ``--steady`` seconds of steady streaming, each of ``--events`` in turn, ``--gap`` seconds apart:
``hup`` (``kill -HUP`` the master: new workers, the old ones drain their streams with ``retry:`` and
exit) and ``kill`` (SIGKILL of one worker, which the master replaces); per event, the clients whose
stream ended in its window and, for each, the time from that end to level again.

CPU: the API workers' CPU time (every worker pid seen, sampled every 0.5 s) over the whole
measurement per run event delivered; **steady** over a window with every client level (µs per event
delivered in it); **per connect**: the CPU of the arrival window (first arrival to every client
level) minus what its deliveries cost at the steady rate, per answered request. RSS per connection:
the workers' RSS growth from before the first client to every client level, per served client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pathlib
import random
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from typing import Any

import psutil
import requests

from harness.redis_server import RedisServer
from harness.served_stack import GunicornServer, ServedStack

from .common import percentile
from .soak import workflows as soak_workflows
from .sse_herd_load import RECORD
from .sse_stack import USER, load_processes_for, raise_open_files, stack_env, start_load_processes
from .sse_starts import DIFY_MIX, START_KINDS, assign_starts, start_label

PROBE = re.compile(rb'"text":"p(\d+)@(\d+\.\d+)')
#: A client level within this many seconds of arriving (or of its stream's end) meets issue 28.
LEVEL_TARGET_S = 10.0


def streaming_workflow(tokens: int, rate: float) -> dict[str, Any]:
    """start → LLM streaming ``tokens`` probe tokens (``pN``, stamped by ``bench.sse_probe``) at ``rate``/s → end."""
    name = f"SSE herd probe: {tokens} tokens at {rate:g}/s"
    return soak_workflows.streaming_workflow(tokens, 1.0 / rate, prefix="p", name=name)


def start_streaming_runs(url: str, key: str, runs: int, spread: float) -> list[str]:
    """Start ``runs`` runs (async mode), one every ``spread / runs`` s; their task ids."""
    task_ids = []
    for index in range(runs):
        answer = requests.post(
            f"{url}/v1/workflows/run",
            json={"inputs": {"name": f"r{index}"}, "user": USER, "response_mode": "async"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        answer.raise_for_status()
        task_ids.append(answer.json()["task_id"])
        time.sleep(spread / runs)
    return task_ids


@dataclasses.dataclass
class RunEvent:
    id: str
    probe: int | None
    stamp: float | None


def read_run(port: int, key: str, task_id: str, *, live_after: float | None, timeout: float = 60) -> list[RunEvent]:
    """A run's events from its start: up to the first probe stamped after ``live_after`` (its live
    tail then), or to ``workflow_finished`` if ``live_after`` is None."""
    request = (
        f"GET /v1/workflow/{task_id}/events?user={USER}&include_state_snapshot=true HTTP/1.0\r\n"
        f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    events: list[RunEvent] = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock, sock.makefile("rb") as stream:
        sock.sendall(request)
        status = stream.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"reading run {task_id}: {status!r}")
        while stream.readline() not in (b"\r\n", b"\n", b""):
            pass
        named, pending = False, ""
        for line in stream:
            if line == b"\n":
                named, pending = False, ""
            elif line.startswith(b"id: "):
                pending = line[4:].strip().decode()
            elif line.startswith(b"event: "):
                named = True
            elif line.startswith(b"data: ") and not named:
                match = PROBE.search(line) if line.startswith(b'data: {"event":"text_chunk"') else None
                probe, stamp = (int(match[1]), float(match[2])) if match else (None, None)
                events.append(RunEvent(pending, probe, stamp))
                if live_after is not None and stamp is not None and stamp > live_after:
                    break
                if line.startswith(b'data: {"event":"workflow_finished"'):
                    break
    return events


def read_runs(port: int, key: str, task_ids: list[str], *, live: bool) -> list[list[RunEvent]]:
    results: list[list[RunEvent]] = [[] for _ in task_ids]

    def one(index: int) -> None:
        results[index] = read_run(port, key, task_ids[index], live_after=time.time() if live else None, timeout=300)

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(task_ids))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


class WorkerWatch:
    """Samples the CPU and RSS of every API worker of ``server`` every ``interval`` s (in a thread).

    A worker's CPU counts up to its last sample (a worker that exits loses at most one interval)."""

    def __init__(self, server: GunicornServer, interval: float = 0.5) -> None:
        self.server = server
        self.interval = interval
        self.cpu_by_pid: dict[int, float] = {}
        self.processes: dict[int, psutil.Process] = {}
        #: (time.time(), CPU seconds of every worker seen, RSS of the live ones, live workers)
        self.samples: list[tuple[float, float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> tuple[float, float, int, int]:
        rss = 0
        live = 0
        for pid in self.server.worker_pids():
            if pid not in self.processes:
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.processes[pid] = psutil.Process(pid)
        for pid, process in list(self.processes.items()):
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    memory = process.memory_info().rss
            except psutil.NoSuchProcess:
                del self.processes[pid]
                continue
            self.cpu_by_pid[pid] = times.user + times.system
            rss += memory
            live += 1
        point = (time.time(), sum(self.cpu_by_pid.values()), rss, live)
        self.samples.append(point)
        return point

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.sample()

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def cpu_between(self, start: float, end: float) -> float:
        return self._at(end)[1] - self._at(start)[1]

    def _at(self, moment: float) -> tuple[float, float, int, int]:
        """The last sample at or before ``moment`` (the first one if none)."""
        chosen = self.samples[0]
        for point in self.samples:
            if point[0] > moment:
                break
            chosen = point
        return chosen


class HerdLoad:
    """``processes`` ``bench.sse_herd_load`` children sharing the clients; their lines are read in threads."""

    def __init__(self, job: dict[str, Any], specs: list[list[Any]], processes: int) -> None:
        self.children: list[subprocess.Popen[str]] = []
        self.progress: dict[int, dict[str, int]] = {}
        self.results: dict[int, dict[str, Any]] = {}
        self._threads = []
        for child in start_load_processes("bench.sse_herd_load", job, "clients", specs, processes):
            self.children.append(child)
            thread = threading.Thread(target=self._read, args=(len(self.children) - 1, child), daemon=True)
            thread.start()
            self._threads.append(thread)
        self.processes = [psutil.Process(child.pid) for child in self.children]
        self.cpu_last: dict[int, float] = {}

    def _read(self, index: int, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            message = json.loads(line)
            if "progress" in message:
                self.progress[index] = message["progress"]
            elif "done" in message:
                self.results[index] = message
        self.results.setdefault(index, {"error": f"load process {child.pid} exited"})

    def total(self, name: str) -> int:
        return sum(part.get(name, 0) for part in self.progress.values())

    def sample_cpu(self) -> None:
        for process in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                self.cpu_last[process.pid] = times.user + times.system

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.results) < len(self.children) and time.monotonic() < deadline:
            self.sample_cpu()
            time.sleep(0.5)
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        return [self.results.get(index, {"error": "no result"}) for index in range(len(self.children))]

    def close(self) -> None:
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            child.wait(timeout=10)
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()


def redis_by_worker(redis: RedisServer, pids: list[int]) -> list[int]:
    counts = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            counts.append(
                sum(
                    1
                    for connection in psutil.Process(pid).net_connections(kind="tcp")
                    if connection.raddr and connection.raddr.port == redis.port
                )
            )
    return counts


def _quantiles(values: list[float], scale: float = 1.0, digits: int = 3) -> list[float | None]:
    """p50, p99, max of ``values`` (``inf`` for a client that never got there)."""
    if not values:
        return [None, None, None]
    out: list[float | None] = []
    for value in (percentile(values, 0.5), percentile(values, 0.99), max(values)):
        out.append(None if math.isinf(value) else round(value * scale, digits))
    return out


def _start_figures(group: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcomes and time to level of the clients of one start kind."""
    return {
        "clients": len(group),
        "refused_then_served": sum(1 for record in group if record["outcome"] == "refused_served"),
        "failed": sum(1 for record in group if record["outcome"] == "failed"),
        "missing": sum(record["missing"] for record in group),
        "duplicated": sum(record["duplicated"] for record in group),
        "time_to_level_s": _quantiles(
            [
                math.inf if record["time_to_level"] is None else record["time_to_level"]
                for record in group
                if record["outcome"] != "failed"
            ]
        ),
    }


def _cdf(values: list[float], points: int = 200) -> list[float]:
    """``points`` evenly spaced quantiles of ``values`` (for the chart)."""
    ordered = sorted(values)
    if not ordered:
        return []
    return [ordered[min(len(ordered) - 1, int(index / points * len(ordered)))] for index in range(points + 1)]


def _wait_level(load: HerdLoad, clients: int, until: float) -> float:
    """Until every client is level, finished or failed (or ``until``, time.time()); the moment it was."""
    while time.time() < until:
        if load.total("started") >= clients and load.total("level") + load.total("failed") >= clients:
            break
        load.sample_cpu()
        time.sleep(0.2)
    return time.time()


def measure_scenario(
    scenario: str,
    clients: int,
    *,
    arrival_rate: float = 1000.0,
    workers: int = 1,
    runs: int = 40,
    rate: float = 1.0,
    start: dict[str, float] | None = None,
    warmup: float = 20.0,
    level_wait: float = 20.0,
    steady: float = 15.0,
    events: tuple[str, ...] = ("hup", "kill"),
    gap: float = 25.0,
    load_processes: int = 4,
    reconnect_ms: float = 500.0,
    jitter_s: float = 0.5,
    extra_env: dict[str, str] | None = None,
    access_log: bool = True,
    directory: pathlib.Path | None = None,
    seed: int = 28,
    profile_dir: pathlib.Path | None = None,
) -> dict[str, Any]:
    """One row of the herd or deploy scenario on a fresh stack (see the module's docstring).

    ``start``: the share of each start kind (``bench.sse_starts.parse_start``; default Dify's mix).
    ``profile_dir``: the API workers profile themselves into ``<profile_dir>/<scenario>-<clients>``
    (``tools/profile_worker_conf.py``, 20 s windows).

    Raises:
        ValueError: the open-files limit leaves no room for a load process's clients.
    """
    shares = dict(DIFY_MIX if start is None else start)
    open_files = raise_open_files()
    # Every load process inherits the hard limit: enough of them that each holds its share of sockets.
    load_processes = load_processes_for(clients, load_processes, open_files)
    rng = random.Random(seed)
    arrival = clients / arrival_rate
    after_level = steady + (gap * len(events) if scenario == "deploy" else 0.0)
    # The runs outlast the measurement: warm-up, arrival, the wait for level, then the rest.
    run_seconds = warmup + arrival + level_wait + after_level + 10.0
    tokens = math.ceil(run_seconds * rate)
    with contextlib.ExitStack() as stack:
        tmp = directory or pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sse-herd-")))
        redis = stack.enter_context(RedisServer(extra=["--maxclients", str(clients * 2 + 1000)]))
        env = stack_env(tmp / "var", redis, "durable", clients, extra_env)
        if profile_dir is not None:
            env["PROFILE_WORKER_DIR"] = str(profile_dir / f"{scenario}-{clients}")
        served = stack.enter_context(
            ServedStack(
                env,
                tmp / "stack",
                servers=1,
                workers_per_server=workers,
                celery_concurrency=runs + 8,
                server_args=["--worker-connections", str(clients + 1000), "--backlog", "4096"],
                celery_app="bench.sse_probe:celery",
                access_log=access_log,
                server_config="python:tools.profile_worker_conf" if profile_dir else "python:api.gunicorn_conf",
            )
        )
        server = served.servers[0]
        key = served.create_app(streaming_workflow(tokens, rate))
        runs_started = time.time()
        task_ids = start_streaming_runs(server.url, key, runs, 1.0 / rate)
        time.sleep(max(0.0, runs_started + warmup - time.time()))

        # Real ids: each run read from its start to its live tail once; cursors from the middle half.
        existing = read_runs(server.port, key, task_ids, live=True)
        specs: list[list[Any]] = []
        cursor_positions: dict[int, tuple[int, int]] = {}  # client -> (run, position of its cursor event)
        first_arrival = time.time() + 2.0
        for index, kind in enumerate(assign_starts(clients, runs, shares)):
            run = index % runs
            start_at = first_arrival + index / arrival_rate
            probes = [(position, event) for position, event in enumerate(existing[run]) if event.probe is not None]
            if kind == "cursor" and probes:
                middle = probes[len(probes) // 4 : max(len(probes) // 4 + 1, 3 * len(probes) // 4)]
                position, event = rng.choice(middle)
                cursor_positions[index] = (run, position)
                specs.append([index, task_ids[run], start_at, kind, event.id, event.probe])
            else:
                # A run with no probe yet has no cursor to give: such a client replays it instead.
                specs.append([index, task_ids[run], start_at, "snapshot" if kind == "cursor" else kind, None, -1])

        watch = WorkerWatch(server)
        watch.start()
        rss_before = watch.samples[-1][2]
        deadline = runs_started + run_seconds + 60.0 + arrival
        job = {
            "host": "127.0.0.1",
            "port": server.port,
            "key": key,
            "user": USER,
            "deadline": deadline,
            "reconnect_ms": reconnect_ms,
            "jitter_s": jitter_s,
            "max_attempts": 50,
        }
        load = HerdLoad(job, specs, load_processes)
        stack.callback(load.close)
        stack.callback(watch.stop)
        load.sample_cpu()
        load_cpu_before = dict(load.cpu_last)

        all_level = _wait_level(load, clients, first_arrival + arrival + level_wait)
        level_at_wait_end = load.total("level")
        connected = watch.sample()
        redis_counts = redis_by_worker(redis, server.worker_pids())
        steady_start = all_level + 1.0
        deploy_events: list[dict[str, Any]] = []
        if scenario == "deploy":
            time.sleep(steady + 1.0)
            steady_end = time.time()
            for name in events:
                pids = server.worker_pids()
                moment = time.time()
                entry: dict[str, Any] = {"event": name, "at": moment, "workers_before": len(pids)}
                if name == "hup":
                    server.reload()
                    exited = None
                    while time.time() < moment + gap:
                        if exited is None and not set(pids) & set(server.worker_pids()):
                            exited = time.time() - moment
                        load.sample_cpu()
                        time.sleep(0.2)
                    entry["old_workers_exit_s"] = None if exited is None else round(exited, 2)
                elif name == "kill":
                    entry["killed"] = server.kill_worker(rng.choice(pids))
                    while time.time() < moment + gap:
                        load.sample_cpu()
                        time.sleep(0.2)
                else:
                    raise ValueError(f"unknown event {name!r}")
                entry["workers_after"] = len(server.worker_pids())
                deploy_events.append(entry)
        else:
            # Steady streaming with every client level until the runs end.
            steady_end = runs_started + run_seconds - 5.0
        done = load.wait(timeout=max(10.0, deadline - time.time() + 30.0))
        finished_at = time.time()
        load.sample_cpu()
        watch.stop()
        totals_stored = [len(events_) for events_ in read_runs(server.port, key, task_ids, live=False)]
        statuses_log = served.statuses()
        timeouts = served.worker_timeouts()
        load_cpu = [load.cpu_last.get(pid, 0.0) - load_cpu_before.get(pid, 0.0) for pid in load_cpu_before]

    return summarize(
        scenario=scenario,
        clients=clients,
        arrival_rate=arrival_rate,
        workers=workers,
        runs=runs,
        rate=rate,
        tokens=tokens,
        shares=shares,
        done=done,
        specs=specs,
        cursor_positions=cursor_positions,
        totals_stored=totals_stored,
        watch=watch,
        first_arrival=first_arrival,
        all_level=all_level,
        level_at_wait_end=level_at_wait_end,
        steady=(steady_start, steady_end),
        finished_at=finished_at,
        rss=(rss_before, connected[2]),
        redis_counts=redis_counts,
        deploy_events=deploy_events,
        statuses_log=statuses_log,
        worker_timeouts=timeouts,
        load_cpu=load_cpu,
        access_log=access_log,
    )


def summarize(
    *,
    scenario: str,
    clients: int,
    arrival_rate: float,
    workers: int,
    runs: int,
    rate: float,
    tokens: int,
    shares: dict[str, float],
    done: list[dict[str, Any]],
    specs: list[list[Any]],
    cursor_positions: dict[int, tuple[int, int]],
    totals_stored: list[int],
    watch: WorkerWatch,
    first_arrival: float,
    all_level: float,
    level_at_wait_end: int,
    steady: tuple[float, float],
    finished_at: float,
    rss: tuple[int, int],
    redis_counts: list[int],
    deploy_events: list[dict[str, Any]],
    statuses_log: Counter[int],
    worker_timeouts: int,
    load_cpu: list[float],
    access_log: bool,
) -> dict[str, Any]:
    records = [dict(zip(RECORD, record, strict=True)) for part in done for record in part.get("records", [])]
    latencies = [tenths / 10 for part in done for tenths in part.get("latencies", [])]
    by_second: Counter[int] = Counter()
    notices: Counter[str] = Counter()
    refusal_codes: Counter[str] = Counter()
    for part in done:
        refusal_codes.update(part.get("refusals", {}))
        by_second.update({int(second): count for second, count in part.get("events_by_second", {}).items()})
        notices.update(part.get("notices", {}))
    outcomes = Counter(record["outcome"] for record in records)
    failures = Counter(record["failure"] for record in records if record["failure"])
    statuses: Counter[int] = Counter(status for record in records for status in record["statuses"])
    # Exactly once against the stored run: every run event after the client's starting point. A tail
    # client's starting point is wherever the run was when it asked: only cursors and snapshots count.
    count_short = count_over = 0
    for record in records:
        if not record["finished"] or record["start"] == "tail":
            continue
        index = record["index"]
        run = index % runs
        expected = totals_stored[run] - (cursor_positions[index][1] + 1 if index in cursor_positions else 0)
        if record["events"] < expected:
            count_short += 1
        elif record["events"] > expected:
            count_over += 1
    levels = [
        math.inf if record["time_to_level"] is None else record["time_to_level"]
        for record in records
        if record["outcome"] != "failed"
    ]
    never_level = sum(1 for value in levels if math.isinf(value))

    def events_between(start: float, end: float) -> int:
        return sum(count for second, count in by_second.items() if start <= second < end)

    delivered = sum(by_second.values())
    start, end = first_arrival, finished_at
    cpu_all = watch.cpu_between(start - 1.0, end)
    steady_start, steady_end = steady
    steady_events = events_between(math.ceil(steady_start), math.floor(steady_end))
    steady_cpu = watch.cpu_between(math.ceil(steady_start), math.floor(steady_end))
    steady_per_event = steady_cpu / steady_events if steady_events else float("nan")
    arrival_events = events_between(math.floor(first_arrival), math.ceil(all_level))
    arrival_cpu = watch.cpu_between(first_arrival - 1.0, all_level)
    answers = sum(len(record["statuses"]) + record["connect_errors"] for record in records)
    per_connect = (
        (arrival_cpu - steady_per_event * arrival_events) / answers
        if answers and not math.isnan(steady_per_event)
        else float("nan")
    )
    served_clients = outcomes["served"] + outcomes["refused_served"]
    by_kind = {kind: [record for record in records if record["start"] == kind] for kind in START_KINDS}
    # A tail stream whose first probe was appended more than one probe interval before it asked
    # started stale: it was handed an event from before the live tail.
    tail_lags = [lag for record in by_kind["tail"] for lag in record["start_lags"]]
    stale_starts = sum(1 for lag in tail_lags if lag > 1.0 / rate)
    row: dict[str, Any] = {
        "scenario": scenario,
        "clients": clients,
        "arrival_rate": arrival_rate,
        "workers": workers,
        "runs": runs,
        "rate_per_run": rate,
        "tokens": tokens,
        "start": start_label(shares),
        "start_shares": shares,
        "access_log": access_log,
        "served": outcomes["served"],
        "refused_then_served": outcomes["refused_served"],
        "failed": outcomes["failed"],
        "failures": dict(failures),
        "refusals_503": sum(record["refused"] for record in records),
        "refusal_codes": dict(refusal_codes),
        # The same figures for each start (a cursor client whose run had no probe yet is a snapshot one).
        "by_start": {kind: _start_figures(group) for kind, group in by_kind.items()},
        "statuses": {str(status): count for status, count in sorted(statuses.items())},
        "connect_errors": sum(record["connect_errors"] for record in records),
        "resumes": sum(record["resumes"] for record in records),
        "clients_resumed": sum(1 for record in records if record["resumes"]),
        "notices": dict(notices),
        "missing": sum(record["missing"] for record in records),
        "duplicated": sum(record["duplicated"] for record in records),
        "out_of_order": sum(record["out_of_order"] for record in records),
        "skipped_on_reconnect": sum(record["skipped_on_reconnect"] for record in records),
        "clients_with_fewer_events": count_short,
        "clients_with_more_events": count_over,
        "unfinished": sum(1 for record in records if not record["finished"]),
        "never_level": never_level,
        "level_within_target": sum(1 for value in levels if value <= LEVEL_TARGET_S),
        "time_to_level_s": _quantiles(levels),
        # How long the server took to answer (the status line), per request: a server that is slow to
        # start streams shows here; a producer that is slow to append does not.
        "answer_wait_s": _quantiles([wait for record in records for wait in record["answer_waits"]]),
        "all_level_after_s": round(all_level - first_arrival, 1),
        "level_at_wait_end": level_at_wait_end,
        "latency_after_level_ms": _quantiles(latencies, digits=1),
        "latency_samples": len(latencies),
        "delivered_events": delivered,
        "cpu_us_per_event": round(cpu_all / delivered * 1e6, 1) if delivered else None,
        "cpu_us_per_event_steady": None if math.isnan(steady_per_event) else round(steady_per_event * 1e6, 1),
        "steady_window_s": round(max(0.0, steady_end - steady_start), 1),
        "cpu_us_per_connect": None if math.isnan(per_connect) else round(per_connect * 1e6, 1),
        "answers": answers,
        "worker_cpu_share": round(cpu_all / max(1e-9, end - start), 3),
        "rss_per_connection_kb": round((rss[1] - rss[0]) / 1024 / max(1, served_clients), 1),
        "rss_before_mb": round(rss[0] / 2**20, 1),
        "rss_connected_mb": round(rss[1] / 2**20, 1),
        "redis_connections_per_worker": redis_counts,
        "server_5xx": sum(count for status, count in statuses_log.items() if status >= 500),
        "server_statuses": {str(status): count for status, count in sorted(statuses_log.items())},
        "worker_timeouts": worker_timeouts,
        "load_cpu_share_max": round(max(load_cpu) / max(1e-9, end - start), 3) if load_cpu else None,
        "time_to_level_cdf_s": [None if math.isinf(value) else round(value, 3) for value in _cdf(levels)],
        "seconds": round(finished_at - first_arrival, 1),
    }
    row["by_start"]["tail"].update(
        streams_with_a_probe=len(tail_lags),
        start_lag_ms=_quantiles(tail_lags, scale=1000.0, digits=1),
        stale_starts=stale_starts,
        skipped_on_reconnect=sum(record["skipped_on_reconnect"] for record in by_kind["tail"]),
    )
    if deploy_events:
        row["events"] = []
        moments = [entry["at"] for entry in deploy_events] + [math.inf]
        for entry, next_moment in zip(deploy_events, moments[1:], strict=True):
            affected: dict[int, list[float]] = {}
            for record in records:
                for ended, again in record["ends"]:
                    if entry["at"] <= ended < next_moment:
                        affected.setdefault(record["index"], []).append(math.inf if again is None else again)
            # Per client: from its (last) stream end in the window to level again.
            recoveries = [values[-1] for values in affected.values()]
            row["events"].append(
                {
                    **{key: value for key, value in entry.items() if key != "at"},
                    "at_s": round(entry["at"] - first_arrival, 1),
                    "clients_affected": len(affected),
                    "stream_ends": sum(len(values) for values in affected.values()),
                    "level_again_within_target": sum(1 for value in recoveries if value <= LEVEL_TARGET_S),
                    "never_level_again": sum(1 for value in recoveries if math.isinf(value)),
                    "level_again_s": _quantiles(recoveries),
                }
            )
    return row


HERD_COLUMNS = (
    ("scenario", "scenario"),
    ("clients", "clients"),
    ("arrival/s", "arrival_rate"),
    ("workers", "workers"),
    ("start", "start"),
    ("served / 503-then-served / failed", "outcomes"),
    ("missing / dup / out of order", "once"),
    ("event count short / over", "counts"),
    ("tail start lag p99 ms / stale", "tail_start"),
    ("tail skipped on reconnect", "skipped_on_reconnect"),
    ("resumes (clients)", "resumes"),
    ("never level", "never_level"),
    ("time to level p50 / p99 / max s", "ttl"),
    ("append→client after level p50 / p99 / max ms", "latency"),
    ("CPU µs/event (all / steady)", "cpu_event"),
    ("CPU µs/connect", "cpu_us_per_connect"),
    ("RSS/conn KB", "rss_per_connection_kb"),
    ("Redis conns per worker", "redis"),
    ("5xx", "server_5xx"),
    ("load CPU max", "load_cpu_share_max"),
)


def _triple(values: list[float | None]) -> str:
    return " / ".join("-" if value is None else f"{value:,g}" for value in values)


def start_of(row: dict[str, Any]) -> str:
    """The row's start mix (``mix 50/25/25``, ``tail``); rows from before ``--start`` had a cursor share."""
    if "start" in row:
        return str(row["start"])
    return f"{row.get('cursor_share', 0.0):.0%} cursors"


def _tail_start(row: dict[str, Any]) -> str:
    tail = row.get("by_start", {}).get("tail", {})
    if not tail.get("streams_with_a_probe"):
        return "-"
    p99 = tail["start_lag_ms"][1]
    return f"{'-' if p99 is None else f'{p99:,g}'} / {tail['stale_starts']:,}"


def herd_cells(row: dict[str, Any]) -> list[str]:
    if "error" in row:
        return [row.get("scenario", ""), str(row.get("clients", "")), f"failed: {row['error']}"] + [""] * (
            len(HERD_COLUMNS) - 3
        )
    values = {
        **row,
        "clients": f"{row['clients']:,}",
        "arrival_rate": f"{row['arrival_rate']:g}",
        "start": start_of(row),
        "tail_start": _tail_start(row),
        "outcomes": f"{row['served']:,} / {row['refused_then_served']:,} / {row['failed']:,}",
        "once": f"{row['missing']} / {row['duplicated']} / {row['out_of_order']}",
        "counts": f"{row['clients_with_fewer_events']} / {row['clients_with_more_events']}",
        "resumes": f"{row['resumes']:,} ({row['clients_resumed']:,})",
        "ttl": _triple(row["time_to_level_s"]),
        "latency": _triple(row["latency_after_level_ms"]),
        "cpu_event": f"{row['cpu_us_per_event']} / {row['cpu_us_per_event_steady']}",
        "redis": ", ".join(str(count) for count in row["redis_connections_per_worker"]),
        "load_cpu_share_max": "-" if row["load_cpu_share_max"] is None else f"{row['load_cpu_share_max']:.0%}",
    }
    return [str(values[key]) for _, key in HERD_COLUMNS]


EVENT_COLUMNS = (
    ("clients", "clients"),
    ("workers", "workers"),
    ("event", "event"),
    ("at s", "at_s"),
    ("clients affected (stream ends)", "affected"),
    ("level again ≤ 10 s", "level_again_within_target"),
    ("never level again", "never_level_again"),
    ("end → level again p50 / p99 / max s", "again"),
    ("old workers exit s", "old_workers_exit_s"),
)


def markdown_tables(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(title for title, _ in HERD_COLUMNS) + " |",
        "|" + "|".join("---:" for _ in HERD_COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(herd_cells(row)) + " |" for row in rows]
    deploy = [(row, event) for row in rows for event in row.get("events", [])]
    if deploy:
        lines += ["", "| " + " | ".join(title for title, _ in EVENT_COLUMNS) + " |"]
        lines += ["|" + "|".join("---:" for _ in EVENT_COLUMNS) + "|"]
        for row, event in deploy:
            values = {
                **event,
                "clients": f"{row['clients']:,}",
                "workers": row["workers"],
                "affected": f"{event['clients_affected']:,} ({event['stream_ends']:,})",
                "again": _triple(event["level_again_s"]),
                "old_workers_exit_s": event.get("old_workers_exit_s", "-"),
            }
            lines.append("| " + " | ".join(str(values[key]) for _, key in EVENT_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def herd_chart(rows: list[dict[str, Any]], path: pathlib.Path) -> pathlib.Path:
    """Time to level, as the share of clients level by then, one line per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(figsize=(6.5, 4))
    for row in rows:
        cdf = row.get("time_to_level_cdf_s") or []
        points = [(value, index / (len(cdf) - 1)) for index, value in enumerate(cdf) if value is not None]
        if len(points) < 2:
            continue
        label = f"{row['clients']:,} @ {row['arrival_rate']:g}/s, {row['workers']} worker(s), start {start_of(row)}"
        if row.get("source"):
            label = f"{row['source']}: {label}"
        axes.plot(*zip(*points, strict=True), label=label)
    axes.axvline(LEVEL_TARGET_S, color="grey", linestyle="--", linewidth=1)
    axes.set_xscale("symlog", linthresh=0.1)
    axes.set_xlabel("time from a client's first attempt to level with its run's live tail (s)")
    axes.set_ylabel("share of clients level")
    axes.set_ylim(0, 1.01)
    axes.set_xlim(left=0)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, loc="upper left")
    axes.set_title("clients that never got level stay off the curve (see the table)", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
