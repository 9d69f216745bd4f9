"""graphon's threads under Celery's pools: a run is graphon's dispatcher thread plus WORKFLOW_GRAPH_WORKERS
node threads (greenlets under gevent). Concurrent runs of the examples succeed on the prefork and gevent
pools, and under the thread pool a worker's threads stay within its concurrency times (workers + 4)
(docs/operations.md, "Threads of a worker")."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from harness.processes import Worker
from harness.waiting import wait_until
from tests.app import examples
from tests.app.conftest import AppHarness
from tests.app.test_service_api import wait_for_status

pytestmark = pytest.mark.timeout(240)
USER = "pool-user"
RUNS = 8


def _start_runs(harness: AppHarness, key: str, inputs: dict[str, Any]) -> list[str]:
    def start(index: int) -> str:
        body = {"inputs": inputs, "user": f"{USER}-{index}", "response_mode": "async"}
        answer = harness.post("/v1/workflows/run", key, body)
        assert answer.status_code == 202, answer.json
        run_id: str = answer.json["workflow_run_id"]
        return run_id

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(start, range(RUNS)))


@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_concurrent_runs_succeed_on_the_prefork_and_gevent_pools(
    make_harness: Callable[..., AppHarness], tmp_path: Any, pool: str
) -> None:
    harness = make_harness(start_worker=False, WORKFLOW_GRAPH_WORKERS=2)
    worker = Worker(harness.env, tmp_path / f"{pool}.log", 4, pool=pool)
    try:
        worker.wait_ready()
        key = harness.create_app("iteration")["api_key"]
        runs = _start_runs(harness, key, {"people": {"names": [f"p{i}" for i in range(30)]}})
        for index, run_id in enumerate(runs):
            done = wait_for_status(harness, key, run_id, f"{USER}-{index}", {"succeeded", "failed"}, timeout=120)
            assert done["status"] == "succeeded" and len(done["outputs"]["greetings"]) == 30, done
    finally:
        worker.stop()


def test_a_thread_pool_worker_stays_within_its_thread_budget(make_harness: Callable[..., AppHarness]) -> None:
    graph_workers, concurrency = 2, 4  # harness.processes starts workers with -c 4
    harness = make_harness(WORKFLOW_GRAPH_WORKERS=graph_workers)
    assert harness.worker is not None
    process = psutil.Process(harness.worker.process.pid)
    idle = process.num_threads()
    definition = examples.script_model(
        examples.greeting(), response=" ".join(f"w{i}" for i in range(200)), token_delay=0.01
    )
    key = harness.create_app(definition)["api_key"]
    runs = _start_runs(harness, key, {"name": "Ada"})
    peak = [idle]

    def all_ended() -> bool:
        peak[0] = max(peak[0], process.num_threads())
        statuses = [
            harness.get(f"/v1/workflows/run/{run_id}?user={USER}-{index}", key).json["status"]
            for index, run_id in enumerate(runs)
        ]
        return all(status in ("succeeded", "failed", "stopped") for status in statuses)

    wait_until(all_ended, 120, "the runs to end", interval=0.02)
    # Idle: the main thread, the reaper and the heartbeat. Each running run (at most `concurrency` at once)
    # adds the pool's thread, its lease renewal, its watchdog timer, graphon's dispatcher and its node threads.
    assert idle < peak[0] <= idle + concurrency * (graph_workers + 4), (idle, peak[0])
