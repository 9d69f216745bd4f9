"""What the crash-safety tests share: fast outbox settings, workers started and killed at will, and the
judgement of "took effect exactly once" from the run's stored events and the workers' logs."""

from __future__ import annotations

import contextlib
import json
import pathlib
import uuid
from typing import Any

from api.models import TaskOutbox, WorkflowRun
from api.models.engine import db
from harness.processes import Worker, stop_workers
from harness.waiting import wait_until
from tests.app.conftest import AppHarness

#: The dispatcher's bounds, short enough for a test: a message is due 0.5 s after its request if that
#: never sent it, and again 1 s after a send that no worker claimed; every worker sweeps 3 times a second.
FAST: dict[str, Any] = {
    "WORKFLOW_DISPATCH_GRACE": 0.5,
    "WORKFLOW_REDISPATCH_AFTER": 1,
    "WORKFLOW_REAPER_INTERVAL": 0.3,
    "WORKFLOW_LEASE_TTL": 2,
    # A worker holds messages it has fetched beside the one it runs (-c 1): some to lose when killed. Three
    # slots, not one: a busy run whose claim took longer than WORKFLOW_REDISPATCH_AFTER (a loaded machine)
    # was sent again, and its duplicate, held until the busy thread is free, must not be all the worker holds.
    "CELERY_PREFETCH_MULTIPLIER": 4,
    "CELERY_VISIBILITY_TIMEOUT": 30,
}
#: Settings each broker adds: Redis (the shared server, a queue of the test's own), Celery's filesystem one.
BROKERS: dict[str, dict[str, Any]] = {"redis": {}, "filesystem": {"CELERY_BROKER_URL": "filesystem://"}}
#: Slow enough to keep a worker's only thread busy for the whole test.
BUSY_RUN = {"tokens": 4000, "delay": 0.05}


class Workers:
    """Celery workers of one harness, started and killed by the test; stopped at its end."""

    def __init__(self, harness: AppHarness) -> None:
        self.harness = harness
        self.started: list[Worker] = []

    def start(self, concurrency: int = 1) -> Worker:
        log = pathlib.Path(self.harness.env["VAR_DIR"]) / f"worker-{uuid.uuid4().hex[:6]}.log"
        worker = Worker(self.harness.env, log, concurrency)
        self.started.append(worker)
        worker.wait_ready()
        return worker

    def logs(self) -> list[dict[str, Any]]:
        lines = []
        for worker in self.started:
            for line in worker.log_path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    lines.append(json.loads(line))
        return lines

    def attempts_started(self, run_id: str, *, resumed: bool = False) -> int:
        """How many attempts of ``run_id`` (resumed ones, or first ones) any worker started, i.e. claimed."""
        wanted = f"run {run_id}: attempt started" + (" (resumed)" if resumed else "")
        return sum(1 for line in self.logs() if line.get("message") == wanted)

    def received(self, task_id: str) -> int:
        return sum(1 for line in self.logs() if f"[{task_id}] received" in line.get("message", ""))

    def stop_all(self) -> None:
        stop_workers(self.started)


def row(harness: AppHarness, run_id: str) -> WorkflowRun:
    with harness.app.app_context():
        run = db.session.get(WorkflowRun, run_id)
        assert run is not None
        db.session.expunge(run)
        db.session.remove()
        return run


def outbox_size(harness: AppHarness) -> int:
    with harness.app.app_context():
        try:
            return db.session.query(TaskOutbox).count()
        finally:
            db.session.remove()


def event_names(harness: AppHarness, run_id: str) -> list[str]:
    return [event["event"] for event in harness.events(run_id)]


def wait_ended(harness: AppHarness, run_id: str, status: str, timeout: float = 40) -> list[str]:
    """Wait for the run's row to be ``status`` and its topic sealed; return its stored events' names."""
    wait_until(lambda: row(harness, run_id).status == status, timeout, f"run {run_id} to be {status}")
    # The row fails first, then its end is written: a worker that died before its first event left no topic.
    wait_until(lambda: harness.sealed(run_id), 15, f"the end of run {run_id} in its topic")
    return event_names(harness, run_id)


def assert_once(names: list[str], *, resumed: bool = False, died: bool = False) -> None:
    """The stored run happened once: one start, one end; a resumed run, one answer taken and one resumption
    (its second ``workflow_started``, as Dify sends one when a paused run goes on). A resumed attempt that
    ``died`` with its worker may have stopped before it sent those: at most once then, never twice."""
    assert names.count("workflow_finished") == 1 and names[-1] == "workflow_finished", names
    if not resumed:
        assert names.count("workflow_started") == 1, names
        return
    resumptions, answers = names.count("workflow_started") - 1, names.count("human_input_form_filled")
    if died:
        assert resumptions <= 1 and answers <= resumptions, names
    else:
        assert resumptions == answers == 1, names
