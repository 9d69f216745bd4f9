"""Graceful drain: a gunicorn worker told to stop ends its event streams at once with a ``retry:``, and
their clients resume on another worker with ``Last-Event-ID``: nothing lost, nothing repeated."""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import requests

from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, connect
from harness.app_env import base_env
from harness.served_stack import GunicornServer, ServedStack
from harness.sse import parse_sse
from harness.waiting import wait_until
from tests.app.test_service_api import slow_greeting

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

RETRY = re.compile(rb"retry: (\d+)\n\n$")
CLIENTS = 8
#: gunicorn's --graceful-timeout here: how long a stopped worker would keep its streams without the drain.
#: Long, so that "well before it" holds however busy the machine is (a reload's old workers wait at most
#: 10 s for their successors to boot before they drain, see api/gunicorn_conf.py).
GRACEFUL = 60


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedStack]:
    directory: pathlib.Path = tmp_path_factory.mktemp("drain")
    env = base_env(directory, SSE_PING_INTERVAL="1", SSE_DRAIN_RETRY_MAX_MS="1500")
    with ServedStack(
        env,
        directory / "stack",
        servers=1,
        workers_per_server=2,
        celery_concurrency=CLIENTS,  # every run at once: each lasts until its test stops it
        server_args=("--graceful-timeout", str(GRACEFUL)),
    ) as served:
        yield served


def read(url: str, key: str, last_event_id: str | None = None) -> tuple[list[dict[str, Any]], list[str], bytes]:
    """One response of a run's events: the events, their ids, and the response's last bytes."""
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    response = requests.get(url, headers=headers, stream=True, timeout=60)
    assert response.status_code == 200, response.text
    tail = b""

    def chunks() -> Iterator[bytes]:
        nonlocal tail
        for chunk in response.iter_content(None):
            tail = (tail + chunk)[-64:]
            yield chunk

    events, ids = [], []
    for message in parse_sse(chunks()):
        if message.is_ping or message.event is not None:
            continue
        events.append(message.json)
        ids.append(message.id or "")
    return events, ids, tail


def stored(stack: ServedStack, run_id: str) -> list[dict[str, Any]]:
    """What the run's topic holds now (without waiting for more)."""
    events = []
    with (
        connect(stack.env["DURABLE_STREAM_URL"]) as backend,
        backend.topic(workflow_run_topic("workflow", run_id)).subscribe_from_beginning() as subscription,
    ):
        while (record := subscription.receive(timeout=0)) not in (None, CLOSED):
            events.append(json.loads(unstamped(record.payload)))  # type: ignore[union-attr]
    return events


#: Runs far longer than any reload (80 s of text): each test stops them once its workers are replaced, so
#: however slowly a busy machine starts the new workers, the clients are mid-run when the old ones drain.
LONG_RUN = slow_greeting(delay=0.02, tokens=4000)


def start_runs(stack: ServedStack, key: str) -> dict[str, str]:
    """``CLIENTS`` runs started, by run id: their task ids."""
    started = [
        requests.post(
            f"{stack.urls[0]}/v1/workflows/run",
            json={"inputs": {"name": f"c{index}"}, "user": "u1", "response_mode": "async"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        ).json()
        for index in range(CLIENTS)
    ]
    return {run["workflow_run_id"]: run["task_id"] for run in started}


def stop_runs(stack: ServedStack, key: str, runs: dict[str, str]) -> None:
    for task_id in runs.values():
        answer = requests.post(
            f"{stack.urls[0]}/v1/workflows/tasks/{task_id}/stop",
            json={"user": "u1"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text


def follow(stack: ServedStack, key: str, run_id: str) -> tuple[list[dict[str, Any]], int]:
    """A client that reads the run from its start, and resumes after each drained response."""
    url = stack.urls[0]
    events, ids, tail = read(f"{url}/v1/workflow/{run_id}/events?user=u1&include_state_snapshot=true", key)
    drained = 0
    while not events or events[-1]["event"] != "workflow_finished":
        found = RETRY.search(tail)
        assert found, f"a stream ended without its run's end or a retry: {tail!r}"
        assert 250 <= int(found.group(1)) <= 1500
        drained += 1
        time.sleep(int(found.group(1)) / 1000)  # as a client does: the server said when to come back
        more, more_ids, tail = read(f"{url}/v1/workflow/{run_id}/events?user=u1", key, last_event_id=ids[-1])
        events, ids = events + more, ids + more_ids
    return events, drained


def test_a_reload_hands_every_stream_to_the_new_workers(stack: ServedStack) -> None:
    key = stack.create_app(LONG_RUN)
    runs = start_runs(stack, key)
    server = stack.servers[0]
    old = set(server.worker_pids())
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        followed = [pool.submit(follow, stack, key, run_id) for run_id in runs]
        wait_until(
            lambda: all(len(stored(stack, run_id)) > 20 for run_id in runs), 30, "every run to stream to its client"
        )
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGHUP)  # gunicorn starts new workers, then stops the old ones
        reloaded = time.monotonic()
        wait_until(lambda: not old & set(server.worker_pids()), GRACEFUL, "the old workers to exit")
        took = time.monotonic() - reloaded
        stop_runs(stack, key, runs)
        results = [future.result() for future in followed]
    # Gone once the new workers were ready, not at the graceful timeout.
    assert took < GRACEFUL / 2, f"the reload took {took:.1f} s"
    # Clients on the old workers were drained (a client served by a new one already is not), once: the
    # old workers drain only when a new one is ready, long after they closed their listeners.
    counts = [drained for _, drained in results]
    assert sum(counts) >= 1 and max(counts) <= 1, counts
    for run_id, (events, _) in zip(runs, results, strict=True):
        assert events == stored(stack, run_id), "a resumed client's copy differs from the stored run"
    assert 500 not in stack.statuses()


def test_a_stopping_worker_hands_its_streams_to_another(stack: ServedStack) -> None:
    key = stack.create_app(LONG_RUN)
    url = stack.urls[0]
    runs = start_runs(stack, key)
    server = stack.servers[0]
    workers = server.worker_pids()
    assert len(workers) == 2

    def follow(run_id: str) -> tuple[list[dict[str, Any]], int]:
        events_url = f"{url}/v1/workflow/{run_id}/events?user=u1&include_state_snapshot=true"
        events, ids, tail = read(events_url, key)
        drained = 0
        while not events or events[-1]["event"] != "workflow_finished":
            found = RETRY.search(tail)
            assert found, f"a stream ended without its run's end or a retry: {tail!r}"
            assert 250 <= int(found.group(1)) <= 1500
            drained += 1
            more, more_ids, tail = read(f"{url}/v1/workflow/{run_id}/events?user=u1", key, last_event_id=ids[-1])
            events, ids = events + more, ids + more_ids
        return events, drained

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        followed = [pool.submit(follow, run_id) for run_id in runs]
        wait_until(
            lambda: all(len(stored(stack, run_id)) > 20 for run_id in runs), 30, "every run to stream to its client"
        )
        stopping = workers[0]
        os.kill(stopping, signal.SIGTERM)
        stopped_at = time.monotonic()
        wait_until(lambda: not psutil.pid_exists(stopping) or _zombie(stopping), GRACEFUL, "the stopped worker to exit")
        took = time.monotonic() - stopped_at
        stop_runs(stack, key, runs)
        results = [future.result() for future in followed]
    # Without the drain the worker would keep its streams until the graceful timeout.
    assert took < GRACEFUL / 2, f"the stopped worker took {took:.1f} s to exit"
    assert sum(drained for _, drained in results) >= 1, "no client was on the stopped worker"
    for run_id, (events, _) in zip(runs, results, strict=True):
        assert events == stored(stack, run_id), "a resumed client's copy differs from the stored run"
    assert 500 not in stack.statuses()


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_stop_that_lands_while_a_worker_boots_is_not_lost(tmp_path: pathlib.Path) -> None:
    # Until a new worker sets its own handlers, its master's (inherited by the fork) only queue a signal:
    # without acting on it once booted, the worker would never stop, and the master would SIGKILL it
    # when its graceful timeout ran out. Long here, so that "before it" holds however slow the boot.
    graceful = 120
    env = base_env(tmp_path, STOP_AT_BOOT_MARKER=str(tmp_path / "stopped-once"))
    server = GunicornServer(
        env,
        tmp_path,
        workers=1,
        config="python:tests.app.fixtures.gunicorn_stop_at_boot",
        extra_args=("--graceful-timeout", str(graceful)),
    )
    server.start()
    try:
        assert server.process is not None
        server.process.wait(timeout=graceful + 30)
    finally:
        server.stop()
    lines = [json.loads(line) for line in server.log_tail(50_000).splitlines() if line.startswith("{")]
    said = {line["message"]: datetime.datetime.fromisoformat(line["ts"]) for line in lines}
    assert "SIGTERM came while this worker booted: acting on it now" in said, said
    assert any(message.startswith("Worker exiting") for message in said), said  # not SIGKILLed
    waited = (said["Shutting down: Master"] - said["Handling signal: term"]).total_seconds()
    assert waited < graceful, f"the master waited {waited:.1f} s for its booting worker"
