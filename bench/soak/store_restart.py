"""Scenario 4: the stream store is killed and restarted, mid-run and while runs write their ends.

Stores: a private Redis without persistence (a restart loses everything), a private Redis with AOF
(``appendfsync always``) and a private PostgreSQL. Variants:

- ``mid-run``: killed while every run streams; a short outage, within ``WORKFLOW_END_RETRY_DEADLINE``.
  Each run's next append fails, so its attempt ends as failed and retries that end until the store is back.
- ``at-end``: killed during the runs' terminal writes (see :mod:`.fault_stores`), a short outage
  within the retry deadline: the workers' retries write the ends.
- ``at-end-long``: the same, with an outage that outlasts the retry deadline: the ends stay pending
  and the reaper writes them once the store is back.

Each run has an SSE client that follows it through the outage (reconnecting with ``Last-Event-ID``
whenever its stream ends early). Invariants: every run ends (terminal row, sealed topic ending with
one ``workflow_finished``); a resumed stream delivers exactly the stored events after its
``Last-Event-ID`` or gets a 410 (``resume_cursor_expired`` / ``run_events_lost``), never a *skip*;
and a late reader without ``Last-Event-ID`` sees the whole run (every event its client saw) or a 410,
never a silently partial run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from api.core.durable_stream import DurableStreamBackend, connect
from harness.served_stack import ServedStack
from harness.sse_client import FollowedRun, Follower, read_run
from harness.waiting import wait_until

from .fault_stores import fault_store
from .report import Table
from .services import Services
from .stack import end_problems, server_problems, soak_env, stored_events, wait_ended
from .verify import ResumeCheck, canonical, check_resumes, compare, outcome_or_canonical
from .workflows import expected_events, streaming_workflow

STORES = ("redis", "redis-aof", "postgres")
VARIANTS = ("mid-run", "at-end", "at-end-long")
COLUMNS = [
    "store",
    "variant",
    "outage (s)",
    "end retry deadline (s)",
    "runs",
    "terminal writes cut",
    "ended",
    "ends",
    "resumed-ok",
    "410s",
    "skips",
    "503s",
    "late readers (whole / 410 / partial)",
    "max s to end",
]


@dataclasses.dataclass
class StoreRestartOptions:
    stores: Sequence[str] = STORES
    variants: Sequence[str] = VARIANTS
    #: At most the PostgreSQL adapter's default pool size (8): at-end holds one pooled connection per run.
    runs: int = 8
    tokens: int = 200
    token_delay: float = 0.01
    outage: float = 2.0
    end_deadline: float = 20.0
    long_outage: float = 8.0
    short_end_deadline: float = 2.0
    reaper_interval: float = 1.0
    deadline: float = 120.0
    seed: int = 4


def run(found: Services, directory: pathlib.Path, options: StoreRestartOptions) -> Table:
    table = Table(
        "store-restart",
        f"Stream store restarts: {options.runs} runs per case",
        COLUMNS,
        notes=[
            f"Workflow: {options.tokens} text chunks {options.token_delay * 1000:g} ms apart "
            f"({expected_events(options.tokens)} events per run). App database: SQLite; broker: Redis (not killed).",
            "'terminal writes cut': runs whose terminal write was in flight at the kill (Redis: the append "
            "the MONITOR saw, the other runs being near their ends; PostgreSQL: seals held by the trigger).",
            "'max s to end': from the kill to the run's terminal row, sealed topic and written end.",
            "'resumed-ok': reconnects with Last-Event-ID that delivered exactly the stored events after it; "
            "'410s': clients stopped by a 410; 'skips': resumed streams that were not the stored suffix.",
            "'503s': reconnects answered 503 while the store was away (the designed answer; the client retries).",
            "'late readers': after the runs ended, one reader per run without Last-Event-ID: the whole run "
            "(containing every event its client saw), a 410, or a partial run (a silent gap).",
        ],
    )
    began = time.monotonic()
    for store_name in options.stores:
        for variant in options.variants:
            row = _case(found, directory / f"store-{store_name}-{variant}", store_name, variant, options, table)
            table.add(row)
    table.seconds = time.monotonic() - began
    return table


def _case(
    found: Services,
    directory: pathlib.Path,
    store_name: str,
    variant: str,
    options: StoreRestartOptions,
    table: Table,
) -> dict[str, Any]:
    long = variant == "at-end-long"
    outage = options.long_outage if long else options.outage
    end_deadline = options.short_end_deadline if long else options.end_deadline
    label = f"{store_name}/{variant}"
    store = fault_store(store_name)
    try:
        store.start()
        env = soak_env(
            directory / "var",
            found,
            store.url,
            WORKFLOW_END_RETRY_DEADLINE=end_deadline,
            WORKFLOW_REAPER_INTERVAL=options.reaper_interval,
        )
        table.settings = {"WORKFLOW_REAPER_INTERVAL": env["WORKFLOW_REAPER_INTERVAL"]}
        with (
            ServedStack(env, directory, servers=2, workers_per_server=1, celery_concurrency=options.runs) as stack,
            concurrent.futures.ThreadPoolExecutor(options.runs, thread_name_prefix="client") as pool,
        ):
            key = stack.create_app(streaming_workflow(options.tokens, options.token_delay))
            if variant != "mid-run":
                with connect(store.url):  # the library's tables exist before the instrument is set on them
                    pass
                store.arm_end_kill()
            followers = [
                Follower(stack.urls, key, rng=random.Random(options.seed * 1000 + index), deadline=options.deadline)
                for index in range(options.runs)
            ]
            futures = [pool.submit(follower.follow) for follower in followers]
            in_flight: int | str = "-"
            if variant == "mid-run":
                wait_until(_mid_stream(followers, 20), 60, "every run to stream", interval=0.01)
                store.kill()
            else:
                in_flight = store.kill_at_end(options.runs, timeout=60)
            killed_at = time.monotonic()
            time.sleep(outage)  # the outage itself
            store.start()
            runs = [future.result() for future in futures]
            # 503 is the answer while the store is away; any other 5xx is a problem.
            table.problems.extend(server_problems(label, stack, expected={503})[1])
            unavailable = stack.statuses()[503]
            with connect(store.url) as backend:
                ended_at = wait_ended(stack, backend, (followed.run_id or "" for followed in runs), options.deadline)
                ended_after = {run_id: at - killed_at for run_id, at in ended_at.items()}
                persistent = store.persistent
                return _verify(stack, backend, key, runs, ended_after, label, table, persistent=persistent) | {
                    "store": store_name,
                    "variant": variant,
                    "outage (s)": outage,
                    "end retry deadline (s)": end_deadline,
                    "503s": unavailable,
                    "terminal writes cut": in_flight,
                }
    finally:
        store.close()


def _mid_stream(followers: list[Follower], events: int) -> Callable[[], bool]:
    return lambda: all(len(f.run.received) >= events and not f.run.finished for f in followers)


def _verify(
    stack: ServedStack,
    backend: DurableStreamBackend,
    key: str,
    runs: list[FollowedRun],
    ended_after: dict[str, float],
    label: str,
    table: Table,
    *,
    persistent: bool,
) -> dict[str, Any]:
    resumes = ResumeCheck()
    late = {"whole": 0, "410": 0, "partial": 0}
    statuses: dict[str, int] = {}
    for followed in runs:
        run_id = followed.run_id or ""
        row = stack.run_row(run_id)
        stored, sealed = stored_events(backend, run_id)
        problems = end_problems(row, stored, sealed)
        if run_id not in ended_after:
            problems.append("never ended")
        if row is not None:
            statuses[row["status"]] = statuses.get(row["status"], 0) + 1
        if followed.failure:
            problems.append(f"its client: {followed.failure}")
        if not followed.finished and followed.gone is None:
            problems.append("its client neither received workflow_finished nor got a 410")
        # A store without persistence lost what its clients had read before the restart: nothing to compare.
        if persistent and followed.finished and followed.gone is None:
            comparison = compare(followed.received, stored, key=outcome_or_canonical)
            if not comparison.exact:
                problems.append(f"its client's copy is not the stored run: {comparison}")
        resumes.add(check_resumes(followed, stored))
        outcome = _late_reader(stack, key, followed, stored)
        late[outcome] += 1
        if outcome == "partial":
            problems.append(
                f"a reader without Last-Event-ID was shown a partial run: {len(stored)} stored events "
                f"({[e['event'] for e in stored[:2]]}…), its client had seen {len(followed.received)}"
            )
        table.problems.extend(f"{label}: run {run_id}: {problem}" for problem in problems)
    table.problems.extend(f"{label}: {detail}" for detail in resumes.details)
    return {
        "runs": len(runs),
        "ended": len(ended_after),
        "ends": ", ".join(f"{count} {status}" for status, count in sorted(statuses.items())),
        "resumed-ok": resumes.resumed_ok,
        "410s": sum(1 for followed in runs if followed.gone),
        "skips": resumes.skips,
        "late readers (whole / 410 / partial)": f"{late['whole']} / {late['410']} / {late['partial']}",
        "max s to end": round(max(ended_after.values()), 1) if ended_after else "-",
    }


def _late_reader(stack: ServedStack, key: str, followed: FollowedRun, stored: list[dict[str, Any]]) -> str:
    """``whole``, ``410`` or ``partial``: what a reader without Last-Event-ID is shown once the run ended."""
    if followed.task_id is None:
        return "partial"
    read = read_run(stack.urls[0], key, followed.task_id)
    if read.status == 410 or (read.error is not None and read.error.get("status") == 410):
        return "410"
    shown = [item.event for item in read.events]
    seen = {canonical(event) for connection in followed.connections for event in _with_ids(connection.events)}
    whole = (
        read.status == 200
        and shown == stored
        and shown[:1] != []
        and shown[0].get("event") == "workflow_started"
        and seen <= {canonical(event) for event in shown}
    )
    return "whole" if whole else "partial"


def _with_ids(items: list[Any]) -> list[dict[str, Any]]:
    # Events without an id were built from the run row by the reader, not read from the topic.
    return [item.event for item in items if item.id is not None]
