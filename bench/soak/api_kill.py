"""Scenario 3: a gunicorn worker process (not the master) is killed with SIGKILL under streaming clients.

Two gunicorn servers on two ports, one gevent worker each. Clients start streaming runs in waves;
once every client of a wave is mid-stream, the worker of one server (alternating per wave) is
killed. Its master starts a new worker; the clients it was serving lose their connections and
reconnect with ``Last-Event-ID`` to a server chosen at random (connections to the killed one wait
in its listen queue until the new worker takes them). Every client's copy must equal the stored run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from api.core.durable_stream import connect
from harness.served_stack import GunicornServer, ServedStack
from harness.sse_client import FollowedRun, Follower
from harness.waiting import wait_until

from .report import Table
from .services import Services, stream_store
from .stack import end_problems, reported, server_problems, soak_env, stored_events, wait_ended
from .verify import Comparison, ResumeCheck, check_resumes, compare
from .workflows import expected_events, streaming_workflow

STORES = ("sqlite", "redis", "postgres")
COLUMNS = [
    "stream store",
    "runs",
    "kills",
    "clients cut",
    "reconnects",
    "lost",
    "duplicated",
    "reordered",
    "resumed exactly",
    "finished",
    "5xx",
    "new worker up after (s)",
]


@dataclasses.dataclass
class ApiKillOptions:
    stores: Sequence[str] = STORES
    runs: int = 60
    wave: int = 20
    tokens: int = 300
    token_delay: float = 0.01
    #: Events every client of a wave must have read before the kill (so that all are mid-stream).
    mid_stream: int = 10
    celery_concurrency: int = 20
    seed: int = 3
    #: How long the worker may take, after its clients read the end, to record that it wrote it.
    end_deadline: float = 30


def run(found: Services, directory: pathlib.Path, options: ApiKillOptions) -> Table:
    table = Table(
        "api-kill",
        f"API worker kill -9 mid-stream: {options.runs} runs per store in waves of {options.wave}, "
        "one gunicorn worker killed per wave",
        COLUMNS,
        notes=[
            f"Workflow: {options.tokens} text chunks {options.token_delay * 1000:g} ms apart "
            f"({expected_events(options.tokens)} events per run). The kill comes once every client of the "
            f"wave has read at least {options.mid_stream} events and none has finished.",
            "'clients cut': clients whose connection the kill broke; 'new worker up after': from the kill to "
            "the master's replacement worker answering (the longest of the waves).",
        ],
    )
    began = time.monotonic()
    for kind in options.stores:
        table.add(_store(found, directory / f"api-kill-{kind}", kind, options, table))
    table.seconds = time.monotonic() - began
    return table


def _store(
    found: Services, directory: pathlib.Path, kind: str, options: ApiKillOptions, table: Table
) -> dict[str, Any]:
    runs: list[FollowedRun] = []
    cut = kills = 0
    respawn = 0.0
    with stream_store(kind, found, directory) as stream_url:
        env = soak_env(directory / "var", found, stream_url)
        table.settings = reported(env, "WORKFLOW_LEASE_TTL", "SSE_PING_INTERVAL")
        with ServedStack(
            env, directory, servers=2, workers_per_server=1, celery_concurrency=options.celery_concurrency
        ) as stack:
            key = stack.create_app(streaming_workflow(options.tokens, options.token_delay))
            for wave in range((options.runs + options.wave - 1) // options.wave):
                size = min(options.wave, options.runs - wave * options.wave)
                victim = stack.servers[wave % len(stack.servers)]
                followers = [
                    Follower(stack.urls, key, rng=random.Random(options.seed * 100_000 + wave * 1000 + index))
                    for index in range(size)
                ]
                with concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="client") as pool:
                    futures = [pool.submit(follower.follow) for follower in followers]
                    wait_until(
                        _mid_stream(followers, options.mid_stream),
                        60,
                        "every client of the wave to be mid-stream",
                        interval=0.01,
                    )
                    on_victim = {id(f) for f in followers if f.run.connections[-1].url == victim.url}
                    killed = victim.kill_worker()
                    killed_at = time.monotonic()
                    kills += 1
                    wait_until(_replaced(victim, killed), 60, "the master to start a new worker")
                    victim.wait_ready()
                    respawn = max(respawn, time.monotonic() - killed_at)
                    wave_runs = [future.result() for future in futures]
                cut += sum(
                    1
                    for f in followers
                    if id(f) in on_victim and any(c.ended in ("broken", "eof") for c in f.run.connections)
                )
                runs.extend(wave_runs)
            errors, served = server_problems(kind, stack)
            table.problems.extend(served)
            totals = Comparison.zero()
            resumes = ResumeCheck()
            with connect(stream_url) as backend:
                wait_ended(stack, backend, (followed.run_id or "" for followed in runs), options.end_deadline)
                for followed in runs:
                    run_id = followed.run_id or ""
                    stored, sealed = stored_events(backend, run_id)
                    problems = end_problems(stack.run_row(run_id), stored, sealed)
                    comparison = compare(followed.received, stored)
                    totals.add(comparison)
                    if not comparison.exact:
                        problems.append(f"the client's copy differs from the stored run: {comparison}")
                    if followed.failure or not followed.finished:
                        problems.append(f"the client did not finish: {followed.failure}")
                    resumes.add(check_resumes(followed, stored))
                    table.problems.extend(f"{kind}: run {run_id}: {problem}" for problem in problems)
    table.problems.extend(f"{kind}: {detail}" for detail in resumes.details)
    return {
        "stream store": kind,
        "runs": len(runs),
        "kills": kills,
        "clients cut": cut,
        "reconnects": sum(followed.reconnects for followed in runs),
        "lost": totals.lost,
        "duplicated": totals.duplicated,
        "reordered": totals.reordered,
        "resumed exactly": resumes.resumed_ok,
        "finished": sum(1 for followed in runs if followed.finished),
        "5xx": errors,
        "new worker up after (s)": round(respawn, 1),
    }


def _mid_stream(followers: list[Follower], events: int) -> Callable[[], bool]:
    return lambda: all(len(f.run.received) >= events and not f.run.finished for f in followers)


def _replaced(server: GunicornServer, killed: int) -> Callable[[], bool]:
    def check() -> bool:
        pids = server.worker_pids()
        return bool(pids) and killed not in pids

    return check
