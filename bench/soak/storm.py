"""Scenario 1, the disconnect storm: every client drops its connection at random points and resumes.

Two gunicorn servers on two ports (one gevent worker each) stand for an API behind a load balancer;
every connection, the first POST and each reconnect, goes to one of them chosen at random. Each
client starts a short streaming run, drops its connection after ``drops`` random numbers of events
(0 means as soon as the response's headers name the run, before any event) and reconnects with the
``Last-Event-ID`` of the last event it read (before any event: from the run's beginning). Its copy of
the run is then matched event by event against the stored run: lost, duplicated, reordered and
foreign events must all be 0 on every durable-stream store.

The broadcast channel (``WORKFLOW_EVENT_TRANSPORT=broadcast_channel``) takes the same storm as the
baseline: it has nothing to resume from, so what a client misses while disconnected is lost; its
copy is matched against an undisturbed run of the same workflow by event shape.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from api.core.durable_stream import DurableStreamBackend, connect
from harness.served_stack import ServedStack
from harness.sse_client import FollowedRun, Follower, random_cuts

from .crowd import follow_all
from .report import Table
from .services import Services, stream_store
from .stack import reported, server_problems, soak_env, stored_events
from .verify import Comparison, ResumeCheck, check_resumes, compare, shape
from .workflows import expected_events, streaming_workflow

STORES = ("sqlite", "redis", "postgres", "broadcast")
COLUMNS = [
    "stream store",
    "runs",
    "finished",
    "reconnects",
    "reconnects per server",
    "lost",
    "duplicated",
    "reordered",
    "foreign",
    "resumed exactly",
    "410",
    "5xx",
    "runs/s",
]


@dataclasses.dataclass
class StormOptions:
    stores: Sequence[str] = STORES
    runs: int = 500
    tokens: int = 60
    token_delay: float = 0.003
    drops: int = 3
    concurrency: int = 16
    celery_concurrency: int = 16
    seed: int = 1


def run(found: Services, directory: pathlib.Path, options: StormOptions) -> Table:
    table = Table(
        "storm",
        f"Disconnect storm: {options.runs} runs per store, {options.drops} drops per client",
        COLUMNS,
        notes=[
            f"Workflow: {options.tokens} text chunks {options.token_delay * 1000:g} ms apart "
            f"({expected_events(options.tokens)} events per run); {options.concurrency} clients at a time.",
            "Two gunicorn servers on two ports, one gevent worker each; every POST and reconnect picks one "
            "at random ('reconnects per server' counts the /events requests each answered).",
            "broadcast: live-only, so reconnects cannot resume; its losses are the expected baseline.",
        ],
    )
    started = time.monotonic()
    for kind in options.stores:
        table.add(_storm(found, directory / f"storm-{kind}", kind, options, table))
    table.seconds = time.monotonic() - started
    return table


def _storm(
    found: Services, directory: pathlib.Path, kind: str, options: StormOptions, table: Table
) -> dict[str, object]:
    live_only = kind == "broadcast"
    with stream_store("sqlite" if live_only else kind, found, directory) as stream_url:
        extra: dict[str, object] = {}
        if live_only:
            extra = {"WORKFLOW_EVENT_TRANSPORT": "broadcast_channel", "REDIS_URL": found.redis_url}
        env = soak_env(directory / "var", found, stream_url, **extra)
        table.settings = reported(env, "WORKFLOW_LEASE_TTL", "SSE_PING_INTERVAL", "WORKFLOW_REAPER_INTERVAL")
        with ServedStack(
            env, directory, servers=2, workers_per_server=1, celery_concurrency=options.celery_concurrency
        ) as stack:
            key = stack.create_app(streaming_workflow(options.tokens, options.token_delay))
            reference: list[dict[str, Any]] = []
            progress: Callable[[dict[str, Any]], int] | None = None
            if live_only:  # an undisturbed run is what every run should have looked like
                reference = Follower(stack.urls, key, rng=random.Random(0)).follow().received
                progress = _placer(reference)
            clients = []
            for index in range(options.runs):
                rng = random.Random(options.seed * 1_000_003 + index)
                cuts = random_cuts(rng, options.drops, expected_events(options.tokens))
                clients.append(Follower(stack.urls, key, rng=rng, cuts=cuts, deadline=300, progress=progress).follow)
            began = time.monotonic()
            runs = follow_all(clients, options.concurrency)
            elapsed = time.monotonic() - began
            per_server = [sum(server.served("/events").values()) for server in stack.servers]
            errors, served = server_problems(kind, stack)
        totals = Comparison.zero()
        resumes = ResumeCheck()
        if live_only:
            for followed in runs:
                totals.add(compare(followed.received, reference, key=shape))
        else:
            with connect(stream_url) as backend:
                for followed in runs:
                    comparison, resumed = _check(backend, followed, kind, table)
                    totals.add(comparison)
                    resumes.add(resumed)
    finished = sum(1 for followed in runs if followed.finished)
    gone = sum(1 for followed in runs if followed.gone)
    for followed in runs:
        if followed.failure:
            table.problems.append(f"{kind}: run {followed.run_id}: {followed.failure}")
    table.problems.extend(served)
    if not live_only:
        if not totals.exact:
            table.problems.append(f"{kind}: {totals}")
        if gone:
            table.problems.append(f"{kind}: {gone} client(s) got a 410 in a storm without faults")
        table.problems.extend(f"{kind}: {detail}" for detail in resumes.details)
    if finished != len(runs):
        table.problems.append(f"{kind}: {len(runs) - finished} client(s) never received workflow_finished")
    return {
        "stream store": kind,
        "runs": len(runs),
        "finished": finished,
        "reconnects": sum(followed.reconnects for followed in runs),
        "reconnects per server": " / ".join(str(count) for count in per_server),
        "lost": totals.lost,
        "duplicated": totals.duplicated,
        "reordered": totals.reordered,
        "foreign": totals.foreign,
        "resumed exactly": "n/a" if live_only else resumes.resumed_ok,
        "410": gone,
        "5xx": errors,
        "runs/s": round(len(runs) / elapsed, 1),
    }


def _check(
    backend: DurableStreamBackend, followed: FollowedRun, kind: str, table: Table
) -> tuple[Comparison, ResumeCheck]:
    if followed.run_id is None:
        return Comparison.zero(), ResumeCheck()
    stored, sealed = stored_events(backend, followed.run_id)
    names = [event.get("event") for event in stored]
    if not sealed or not names or names[0] != "workflow_started" or names[-1] != "workflow_finished":
        table.problems.append(
            f"{kind}: run {followed.run_id}: stored run is not whole (sealed={sealed}, {names[:1]}…{names[-1:]})"
        )
    elif stored[-1]["data"]["status"] != "succeeded":
        table.problems.append(
            f"{kind}: run {followed.run_id} ended {stored[-1]['data']['status']}: {stored[-1]['data']['error']}"
        )
    return compare(followed.received, stored), check_resumes(followed, stored)


def _placer(reference: list[dict[str, Any]]) -> Callable[[dict[str, Any]], int]:
    """An event's place in a whole run, so that a live-only client drops at the same points of the run."""
    places = {shape(event): index for index, event in enumerate(reference)}
    return lambda event: places.get(shape(event), 0)
