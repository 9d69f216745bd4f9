"""Scenario 2: a Celery worker holding started *and* prefetched runs is killed with SIGKILL.

One worker (``-c 2``, ``CELERY_PREFETCH_MULTIPLIER=4``) takes every run it is allowed: two start,
up to six more wait in its hands (prefetched), the rest wait in the broker. Every run has an SSE
client streaming it through gunicorn. Once the started runs stream and the prefetched messages are
in the worker's hands, the worker is killed and another one started. Every run must end visibly (a
terminal row, a sealed topic ending with one ``workflow_finished``) and every client must receive
``workflow_finished``, reconnecting with ``Last-Event-ID`` whenever its stream ends early.

Expected ends: started runs fail when their lease expires; prefetched runs are delivered again
after the visibility timeout and succeed on the Redis broker, while the filesystem broker deleted
their messages when the dead worker fetched them, so they fail at the start deadline; runs still in
the broker succeed on the new worker.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import random
import time
from collections.abc import Sequence
from typing import Any

from api.core.durable_stream import connect
from harness.served_stack import ServedStack
from harness.sse_client import Follower
from harness.waiting import wait_until

from .broker import queued_run_ids, unacked
from .report import Table
from .services import Services, stream_store
from .stack import end_problems, reported, server_problems, soak_env, stored_events, wait_ended
from .verify import compare
from .workflows import streaming_workflow

BROKERS = ("redis", "filesystem")
#: A Redis database of the soak's private server that only this scenario uses (its "unacked" hash).
BROKER_DB = 2
CATEGORIES = ("started", "prefetched", "queued")
COLUMNS = [
    "broker",
    "start timeout (s)",
    "runs (started / prefetched / queued)",
    "ended",
    "clients finished",
    "exact copies",
    "ends (started / prefetched / queued)",
    "max s kill → end (started / prefetched / queued)",
]


@dataclasses.dataclass
class CeleryKillOptions:
    brokers: Sequence[str] = BROKERS
    runs: int = 10
    tokens: int = 150
    token_delay: float = 0.02
    concurrency: int = 2
    prefetch: int = 4
    lease_ttl: float = 4
    reaper_interval: float = 1
    visibility_timeout: float = 8
    #: Per broker: long enough on Redis for the survivor to work through the redelivered runs, short on
    #: the filesystem broker, where the start deadline is what ends runs whose messages died.
    start_timeout: dict[str, float] = dataclasses.field(default_factory=lambda: {"redis": 60, "filesystem": 12})
    deadline: float = 120
    seed: int = 2


def run(found: Services, directory: pathlib.Path, options: CeleryKillOptions) -> Table:
    table = Table(
        "celery-kill",
        f"Celery worker kill -9: {options.runs} runs, worker -c {options.concurrency}, "
        f"prefetch multiplier {options.prefetch}",
        COLUMNS,
        notes=[
            "'max s kill → end': from the SIGKILL to the moment each run's client received workflow_finished.",
            "Stream store: SQLite. Expected bounds: started ≈ lease TTL + a reader's or the reaper's check; "
            "prefetched (Redis) ≈ visibility timeout + the survivor's queue; prefetched (filesystem) ≈ start "
            "timeout + a check.",
        ],
    )
    began = time.monotonic()
    for broker in options.brokers:
        table.add(_kill(found, directory / f"celery-kill-{broker}", broker, options, table))
    table.seconds = time.monotonic() - began
    return table


def _kill(
    found: Services, directory: pathlib.Path, broker: str, options: CeleryKillOptions, table: Table
) -> dict[str, Any]:
    with stream_store("sqlite", found, directory) as stream_url:
        env = soak_env(
            directory / "var",
            found,
            stream_url,
            CELERY_BROKER_URL=found.redis_db(BROKER_DB) if broker == "redis" else "filesystem://",
            CELERY_PREFETCH_MULTIPLIER=options.prefetch,
            CELERY_VISIBILITY_TIMEOUT=options.visibility_timeout,
            WORKFLOW_LEASE_TTL=options.lease_ttl,
            WORKFLOW_REAPER_INTERVAL=options.reaper_interval,
            WORKFLOW_START_TIMEOUT=options.start_timeout[broker],
        )
        table.settings = {
            **reported(
                env,
                "WORKFLOW_LEASE_TTL",
                "WORKFLOW_REAPER_INTERVAL",
                "CELERY_VISIBILITY_TIMEOUT",
                "CELERY_PREFETCH_MULTIPLIER",
            ),
            "worker -c": options.concurrency,
        }
        with (
            ServedStack(
                env, directory, servers=2, workers_per_server=1, celery_concurrency=options.concurrency
            ) as stack,
            connect(stream_url) as backend,
            concurrent.futures.ThreadPoolExecutor(options.runs, thread_name_prefix="client") as pool,
        ):
            key = stack.create_app(streaming_workflow(options.tokens, options.token_delay))
            followers = [
                Follower(stack.urls, key, rng=random.Random(options.seed * 1000 + index), deadline=options.deadline)
                for index in range(options.runs)
            ]
            futures = [pool.submit(follower.follow) for follower in followers]
            categories = _hold_and_kill(stack, env, followers, options)
            killed_at = time.monotonic()
            stack.start_worker(options.concurrency, wait=False)
            ended_at = wait_ended(stack, backend, (f.run.run_id or "" for f in followers), options.deadline)
            runs = [future.result() for future in futures]
            table.problems.extend(server_problems(broker, stack)[1])
            outcomes: dict[str, list[str]] = {category: [] for category in CATEGORIES}
            seconds: dict[str, list[float]] = {category: [] for category in CATEGORIES}
            exact = 0
            for followed in runs:
                run_id = followed.run_id or ""
                category = categories.get(run_id, "queued")
                row = stack.run_row(run_id)
                stored, sealed = stored_events(backend, run_id)
                problems = end_problems(row, stored, sealed)
                if run_id not in ended_at:
                    problems.append("never ended")
                if not followed.finished:
                    problems.append(f"its client never received workflow_finished ({followed.failure})")
                else:
                    assert followed.finished_at is not None
                    seconds[category].append(followed.finished_at - killed_at)
                if compare(followed.received, stored).exact:
                    exact += 1
                else:
                    problems.append(
                        f"the client's copy differs from the stored run: {compare(followed.received, stored)}"
                    )
                outcomes[category].append(row["status"] if row else "?")
                table.problems.extend(f"{broker}: run {run_id} ({category}): {problem}" for problem in problems)
    return {
        "broker": broker,
        "start timeout (s)": env["WORKFLOW_START_TIMEOUT"],
        "runs (started / prefetched / queued)": " / ".join(str(len(outcomes[c])) for c in CATEGORIES),
        "ended": len(ended_at),
        "clients finished": sum(1 for followed in runs if followed.finished),
        "exact copies": exact,
        "ends (started / prefetched / queued)": " / ".join(_summary(outcomes[c]) for c in CATEGORIES),
        "max s kill → end (started / prefetched / queued)": " / ".join(
            f"{max(seconds[c]):.1f}" if seconds[c] else "-" for c in CATEGORIES
        ),
    }


def _hold_and_kill(
    stack: ServedStack, env: dict[str, str], followers: list[Follower], options: CeleryKillOptions
) -> dict[str, str]:
    """Wait until the worker streams its started runs and holds its prefetched ones; kill it.

    Returns each run's category at the moment of the kill.
    """
    wait_until(lambda: all(f.run.run_id for f in followers), 60, "every run to be created")
    held = min(options.runs, options.concurrency * options.prefetch)

    def streaming() -> bool:
        texts = sum(
            1 for f in followers if not f.run.finished and any(e["event"] == "text_chunk" for e in f.run.received)
        )
        return texts >= min(options.runs, options.concurrency)

    wait_until(streaming, 60, "the started runs to stream")
    if env["CELERY_BROKER_URL"].startswith("redis"):
        wait_until(lambda: unacked(env) >= held, 30, f"{held} messages in the worker's hands")
    else:
        wait_until(lambda: len(queued_run_ids(env)) <= options.runs - held, 30, f"the worker to fetch {held}")
    queued = queued_run_ids(env)
    started = {f.run.run_id for f in followers if (stack.run_row(f.run.run_id or "") or {}).get("attempt_started_at")}
    stack.celery[0].kill()
    categories = {}
    for follower in followers:
        run_id = follower.run.run_id or ""
        categories[run_id] = "started" if run_id in started else "queued" if run_id in queued else "prefetched"
    return categories


def _summary(statuses: list[str]) -> str:
    if not statuses:
        return "-"
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{count} {status}" for status, count in sorted(counts.items()))
