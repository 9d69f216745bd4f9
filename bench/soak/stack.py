"""The served app for one scenario: its settings, and reading back what a run stored."""

from __future__ import annotations

import json
import pathlib
import time
from collections.abc import Collection, Iterable
from typing import Any

from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, DurableStreamBackend
from harness.app_env import base_env
from harness.served_stack import ServedStack

from .services import Services

#: Settings every scenario shares unless it says otherwise (see ``api/configs``).
COMMON = {
    "SSE_PING_INTERVAL": 1,
    # Generous: under a storm on two cores a renewal can be late, and a lease that lapses while its
    # worker still runs would end a healthy run (the fault scenarios set their own, shorter TTLs).
    "WORKFLOW_LEASE_TTL": 15,
    "WORKFLOW_REAPER_INTERVAL": 2,
    "APP_MAX_EXECUTION_TIME": 600,
}


def soak_env(var_dir: pathlib.Path, found: Services, stream_url: str, **overrides: Any) -> dict[str, str]:
    settings: dict[str, Any] = {
        **COMMON,
        "CELERY_BROKER_URL": found.broker_url,
        "DURABLE_STREAM_URL": stream_url,
        **overrides,
    }
    return base_env(var_dir, **settings)


def reported(env: dict[str, str], *names: str) -> dict[str, str]:
    """The settings a table states, as the processes got them."""
    return {name: env[name] for name in names if name in env}


def stored_events(
    backend: DurableStreamBackend, run_id: str, timeout: float = 5.0
) -> tuple[list[dict[str, Any]], bool]:
    """The run's retained events, and whether the topic ended sealed (read until CLOSED or ``timeout`` idle)."""
    events: list[dict[str, Any]] = []
    topic = backend.topic(workflow_run_topic("workflow", run_id))
    with topic.subscribe_from_beginning() as subscription:
        while True:
            record = subscription.receive(timeout=timeout)
            if record is CLOSED:
                return events, True
            if record is None:
                return events, False
            events.append(json.loads(unstamped(record.payload)))


TERMINAL = ("succeeded", "failed", "stopped")


def run_ended(row: dict[str, Any] | None, backend: DurableStreamBackend, run_id: str) -> bool:
    """The run has ended visibly: a terminal row whose end is on a sealed topic."""
    if row is None or row["status"] not in TERMINAL or not row["stream_ended"]:
        return False
    info = backend.admin.topic_info(workflow_run_topic("workflow", run_id))
    return info is not None and info.sealed


def wait_ended(
    stack: ServedStack, backend: DurableStreamBackend, run_ids: Iterable[str], deadline: float
) -> dict[str, float]:
    """Poll until every run ended visibly (or ``deadline`` seconds passed); when each was first seen ended.

    A client finishes on reading the end from the stream; the worker records in the row that the
    end is written only after that, so a check right after the clients finished would race it.
    """
    pending = set(run_ids)
    ended: dict[str, float] = {}
    limit = time.monotonic() + deadline
    while pending and time.monotonic() < limit:
        for run_id in sorted(pending):
            if run_ended(stack.run_row(run_id), backend, run_id):
                ended[run_id] = time.monotonic()
                pending.discard(run_id)
        if pending:
            time.sleep(0.1)
    return ended


def end_problems(row: dict[str, Any] | None, stored: list[dict[str, Any]], sealed: bool) -> list[str]:
    """What is wrong with an ended run's row and stored events (nothing, for a run that ended visibly)."""
    if row is None:
        return ["no run row"]
    problems = []
    if row["status"] not in TERMINAL:
        problems.append(f"row status {row['status']}")
    if not row["stream_ended"]:
        problems.append("row says its end is still pending")
    if not sealed:
        problems.append("topic not sealed")
    names = [event.get("event") for event in stored]
    if names.count("workflow_finished") != 1 or names[-1:] != ["workflow_finished"]:
        problems.append(f"stored run does not end with exactly one workflow_finished: …{names[-3:]}")
    elif stored[-1]["data"]["status"] != row["status"]:
        problems.append(f"stored end says {stored[-1]['data']['status']}, row says {row['status']}")
    return problems


def server_problems(label: str, stack: ServedStack, *, expected: Collection[int] = ()) -> tuple[int, list[str]]:
    """5xx answers (other than ``expected`` ones) and hung gunicorn workers, as problems; and the 5xx count."""
    errors = sum(n for status, n in stack.statuses().items() if status >= 500 and status not in expected)
    problems = []
    if errors:
        problems.append(f"{label}: {errors} answer(s) with a 5xx status (see the access logs in {stack.directory})")
    if timeouts := stack.worker_timeouts():
        problems.append(
            f"{label}: gunicorn killed {timeouts} worker(s) that stopped responding for 30 s (WORKER TIMEOUT: "
            f"a blocked gevent hub; see the logs in {stack.directory})"
        )
    return errors, problems
