"""Scenario 6: the gaps between processes — who ends a run when the process that should is gone.

Three cases, a row each, against gunicorn gevent + Celery (SQLite app data):

- **only worker killed, nobody reading.** ``runs`` runs stream on the only Celery worker, which is
  killed with SIGKILL and not replaced. Nobody reads the runs (the rows and topics are polled from
  the database and the store directly). The API processes' reaper must end each one: a failed row
  and a sealed topic ending with ``workflow_finished``, within lease TTL + one API sweep.
- **run committed, task never queued.** ``runs`` runs are committed exactly as ``POST
  /workflows/run`` commits them, by an API process that then dies before it sends the task message
  (simulated: the message is never sent). The next sweep after ``WORKFLOW_DISPATCH_GRACE`` queues
  each again; each must succeed, with its history written once.
- **cold stream store.** A fresh gunicorn worker whose store is down from its first request: every
  endpoint is asked once; none may answer 500, every 503 carries ``Retry-After``, no message shows
  an address or driver text. Then the store comes back and a run streams normally.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import time
from typing import Any

import requests

from api.core.durable_stream import connect
from api.models import App
from api.models.engine import db
from api.services import workflow_run_service
from harness.redis_server import RedisServer
from harness.served_stack import ServedStack
from harness.waiting import wait_until

from .report import Table
from .services import Services, stream_store
from .stack import end_problems, reported, server_problems, soak_env, stored_events, wait_ended
from .workflows import streaming_workflow

COLUMNS = ["case", "runs or requests", "ended as expected", "bound (s)", "max s to the end", "5xx", "problems"]
INTERNALS = re.compile(r"127\.0\.0\.1|localhost|:\d{2,5}\b|/tmp/|Error \d+|Traceback|onnect(ing|ion refused)")


@dataclasses.dataclass
class GapsOptions:
    runs: int = 6
    lease_ttl: float = 3
    api_sweep: float = 1
    dispatch_grace: float = 2
    deadline: float = 60


def run(found: Services, directory: pathlib.Path, options: GapsOptions) -> Table:
    table = Table(
        "gaps",
        "Gaps between processes: nobody left to end a run, a lost task message, a cold store",
        COLUMNS,
        notes=[
            "'max s to the end': from the kill (or the commit) to the terminal row and sealed topic, "
            "polled from the database and the store, never through the API.",
            "The cold store row counts requests; every one must be answered 400/503 (or 200 where the "
            "store is not needed), none 500.",
        ],
    )
    began = time.monotonic()
    table.add(_only_worker_killed(found, directory / "killed", options, table))
    table.add(_task_never_queued(found, directory / "unqueued", options, table))
    table.add(_cold_store(found, directory / "cold", table))
    table.seconds = time.monotonic() - began
    return table


def _start(url: str, key: str, inputs: dict[str, Any], mode: str = "async") -> dict[str, Any]:
    answer = requests.post(
        f"{url}/v1/workflows/run",
        json={"inputs": inputs, "user": "soak", "response_mode": mode},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    body: dict[str, Any] = answer.json()
    return body


def _only_worker_killed(found: Services, directory: pathlib.Path, options: GapsOptions, table: Table) -> dict[str, Any]:
    with stream_store("sqlite", found, directory) as stream_url:
        env = soak_env(
            directory / "var",
            found,
            stream_url,
            WORKFLOW_LEASE_TTL=options.lease_ttl,
            API_REAPER_INTERVAL=options.api_sweep,
            WORKFLOW_REAPER_INTERVAL=0,
        )
        table.settings.update(reported(env, "WORKFLOW_LEASE_TTL", "API_REAPER_INTERVAL"))
        with ServedStack(env, directory, servers=1, workers_per_server=2, celery_concurrency=options.runs) as stack:
            key = stack.create_app(streaming_workflow(3000, 0.02))
            run_ids = [
                _start(stack.urls[0], key, {"name": f"r{index}"})["workflow_run_id"] for index in range(options.runs)
            ]
            wait_until(
                lambda: all((stack.run_row(run_id) or {}).get("attempt_started_at") for run_id in run_ids),
                30,
                "every run to start",
            )
            stack.celery[0].kill()
            killed = time.monotonic()
            with connect(stream_url) as backend:
                ended = wait_ended(stack, backend, run_ids, options.deadline)
                problems = _ended_problems(stack, backend, run_ids, ended, "failed")
            errors, more = server_problems("only worker killed", stack)
    bound = options.lease_ttl + options.api_sweep * 1.2
    took = max((at - killed for at in ended.values()), default=float("nan"))
    if took > bound + 2:
        problems.append(f"the slowest run ended {took:.1f} s after the kill (bound {bound:.1f} s)")
    table.problems.extend(f"only worker killed: {problem}" for problem in problems + more)
    return _row("only worker killed, nobody reading", len(run_ids), len(ended), bound, took, errors, problems + more)


def _task_never_queued(found: Services, directory: pathlib.Path, options: GapsOptions, table: Table) -> dict[str, Any]:
    with stream_store("sqlite", found, directory) as stream_url:
        env = soak_env(directory / "var", found, stream_url, WORKFLOW_DISPATCH_GRACE=options.dispatch_grace)
        table.settings.update(reported(env, "WORKFLOW_DISPATCH_GRACE", "WORKFLOW_REAPER_INTERVAL"))
        with ServedStack(env, directory, servers=1, workers_per_server=1, celery_concurrency=4) as stack:
            key = stack.create_app(streaming_workflow(20, 0.01))
            with stack.app.app_context():
                app = db.session.query(App).filter(App.api_key == key).one()
                run_ids = [
                    workflow_run_service.create_run(app, {"name": f"r{i}"}, "soak").id for i in range(options.runs)
                ]
                db.session.remove()
            committed = time.monotonic()
            with connect(stream_url) as backend:
                ended = wait_ended(stack, backend, run_ids, options.deadline)
                problems = _ended_problems(stack, backend, run_ids, ended, "succeeded")
            errors, more = server_problems("task never queued", stack)
    bound = options.dispatch_grace + float(env["WORKFLOW_REAPER_INTERVAL"]) * 1.2
    took = max((at - committed for at in ended.values()), default=float("nan"))
    table.problems.extend(f"task never queued: {problem}" for problem in problems + more)
    return _row("run committed, task never queued", len(run_ids), len(ended), bound, took, errors, problems + more)


def _cold_store(found: Services, directory: pathlib.Path, table: Table) -> dict[str, Any]:
    problems: list[str] = []
    with RedisServer() as store:
        env = soak_env(directory / "var", found, f"{store.url}?key_prefix=cold:")
        with ServedStack(env, directory, servers=1, workers_per_server=1, celery_concurrency=2) as stack:
            key = stack.create_app(streaming_workflow(20, 0.01))
            base, auth = stack.urls[0], {"Authorization": f"Bearer {key}"}
            finished = _start(base, key, {"name": "r0"}, mode="blocking")
            run_id = finished["workflow_run_id"]
            server = stack.servers[0]
            store.kill()
            # The worker's replacement (as after a crash or a reload) meets the store first in the outage.
            old = server.kill_worker()
            wait_until(lambda: server.worker_pids() and old not in server.worker_pids(), 30, "a new API worker")
            server.wait_ready()
            body: dict[str, Any] = {"inputs": {"name": "r1"}, "user": "soak"}
            answers = [
                requests.post(
                    f"{base}/v1/workflows/run", json={**body, "response_mode": mode}, headers=auth, timeout=30
                )
                for mode in ("streaming", "blocking")
            ]
            for query in ("", "&include_state_snapshot=true", "&last_event_id=garbage"):
                url = f"{base}/v1/workflow/{run_id}/events?user=soak{query}"
                answers.append(requests.get(url, headers=auth, timeout=30))
            answers.append(requests.get(f"{base}/v1/workflows/run/{run_id}?user=soak", headers=auth, timeout=30))
            for answer in answers:
                what = f"{answer.request.method} {answer.url.removeprefix(base)}"
                if answer.status_code >= 500 and answer.status_code != 503:
                    problems.append(f"{what}: {answer.status_code}")
                if answer.status_code == 503 and not answer.headers.get("Retry-After"):
                    problems.append(f"{what}: 503 without Retry-After")
                if answer.headers.get("Content-Type", "").startswith("application/json"):
                    message = str(answer.json().get("message", ""))
                    if INTERNALS.search(message):
                        problems.append(f"{what}: shows internals: {message}")
            store.start()
            again = _start(base, key, {"name": "r2"}, mode="blocking")
            if again.get("data", {}).get("status") != "succeeded":
                problems.append(f"after the store came back a run did not succeed: {again}")
            errors, more = server_problems("cold store", stack, expected=(503,))
    table.problems.extend(f"cold store: {problem}" for problem in problems + more)
    statuses = ", ".join(str(status) for status in sorted({answer.status_code for answer in answers}))
    row = _row(f"cold store, fresh API worker (answers {statuses})", len(answers), 0, NAN, NAN, errors, problems)
    row["ended as expected"] = len(answers) - len(problems)
    return row


NAN = float("nan")


def _ended_problems(
    stack: ServedStack, backend: Any, run_ids: list[str], ended: dict[str, float], status: str
) -> list[str]:
    problems: list[str] = []
    for run_id in run_ids:
        row = stack.run_row(run_id)
        stored, sealed = stored_events(backend, run_id, timeout=1)
        found = end_problems(row, stored, sealed)
        if run_id not in ended:
            found.append("never ended")
        if row is not None and row["status"] != status:
            found.append(f"ended {row['status']}, expected {status}")
        names = [event.get("event") for event in stored]
        if names.count("workflow_started") != 1:
            found.append(f"{names.count('workflow_started')} workflow_started events")
        problems.extend(f"run {run_id}: {problem}" for problem in found)
    return problems


def _row(
    case: str, count: int, ended: int, bound: float, took: float, errors: int, problems: list[str]
) -> dict[str, Any]:
    return {
        "case": case,
        "runs or requests": count,
        "ended as expected": ended,
        "bound (s)": "-" if bound != bound else f"{bound:.1f}",
        "max s to the end": "-" if took != took else f"{took:.1f}",
        "5xx": errors,
        "problems": len(problems),
    }
