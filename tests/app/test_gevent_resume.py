"""Under real gunicorn gevent workers: clients that keep dropping and reconnecting with Last-Event-ID
see every event of the run exactly once, in order, whichever worker serves each reconnect."""

from __future__ import annotations

import json
import pathlib
import random
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from api.app_factory import create_app
from api.configs import AppConfig
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, connect
from tests.app.conftest import base_env
from tests.app.test_service_api import slow_greeting
from tests.support.processes import BIN, ROOT, process_env, running_gunicorn, running_worker
from tests.support.sse import parse_sse

RUNS = 6
DISCONNECTS_PER_RUN = 4


def stream_urls(tmp: pathlib.Path) -> dict[str, str]:
    return {
        "sqlite": f"sqlite:///{tmp / 'streams.db'}",
        "redis": f"redis://127.0.0.1:6379/0?key_prefix=gevent-{uuid.uuid4().hex[:8]}:",
    }


@pytest.fixture(params=["sqlite", "redis"])
def served(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Iterator[tuple[str, dict[str, str], pathlib.Path]]:
    env = base_env(tmp_path, DURABLE_STREAM_URL=stream_urls(tmp_path)[request.param], SSE_PING_INTERVAL="1")
    create_app(AppConfig(**env))  # creates the tables before three processes race to
    access_log = tmp_path / "access.log"
    with (
        running_worker(env, tmp_path / "worker.log", concurrency=8),
        running_gunicorn(env, tmp_path, access_log=access_log) as base,
    ):
        yield base, env, access_log


def follow_with_disconnects(base: str, key: str, rng: random.Random) -> tuple[str, list[dict[str, Any]], int]:
    """Start a streaming run, drop the connection at random points, reconnect with Last-Event-ID."""
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    response = requests.post(
        f"{base}/v1/workflows/run",
        json={"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "streaming"},
        headers=headers,
        stream=True,
        timeout=60,
    )
    received: list[dict[str, Any]] = []
    last_id: str | None = None
    task_id: str | None = None
    reconnects = 0
    disconnects_left = DISCONNECTS_PER_RUN
    while True:
        assert response.status_code == 200, response.text
        budget = rng.randint(1, 40) if disconnects_left else None
        finished = False
        for message in parse_sse(response.iter_content(chunk_size=None)):
            if message.event == "run_created":  # the ids come first, so even an early drop can reconnect
                task_id = message.json["task_id"]
            if message.event is not None:
                continue
            event = message.json
            received.append(event)
            last_id = message.id
            task_id = event["task_id"]
            if event["event"] == "workflow_finished":
                finished = True
                break
            if budget is not None:
                budget -= 1
                if budget == 0:
                    break
        response.close()
        if finished:
            return task_id or "", received, reconnects
        assert task_id is not None and last_id is not None
        disconnects_left = max(0, disconnects_left - 1)
        reconnects += 1
        response = requests.get(
            f"{base}/v1/workflow/{task_id}/events?user=u1",
            headers={**headers, "Last-Event-ID": last_id},
            stream=True,
            timeout=60,
        )


def test_dropping_clients_resume_exactly_through_gunicorn_gevent(
    served: tuple[str, dict[str, str], pathlib.Path],
) -> None:
    base, env, access_log = served
    created = subprocess.run(
        [str(BIN / "flask"), "--app", "api.app", "create-app", "--file", "/dev/stdin"],
        input=json.dumps(slow_greeting(delay=0.004, tokens=150)),
        cwd=ROOT,
        env=process_env(env),
        capture_output=True,
        text=True,
        check=True,
    )
    key = json.loads(created.stdout)["api_key"]
    results: list[tuple[str, list[dict[str, Any]], int]] = []
    errors: list[BaseException] = []

    def client(seed: int) -> None:
        try:
            results.append(follow_with_disconnects(base, key, random.Random(seed)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(RUNS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not errors, errors
    assert len(results) == RUNS

    with connect(env["DURABLE_STREAM_URL"]) as backend:
        for _task_id, received, reconnects in results:
            run_id = received[0]["workflow_run_id"]
            stored = []
            with backend.topic(workflow_run_topic("workflow", run_id)).subscribe_from_beginning() as subscription:
                while (record := subscription.receive(timeout=5)) is not CLOSED:
                    assert record is not None, "the run's topic was never sealed"
                    stored.append(json.loads(record.payload))
            assert reconnects >= 1
            assert received == stored, (
                f"run {run_id}: events lost, repeated or reordered across {reconnects} reconnects"
            )
            assert stored[0]["event"] == "workflow_started" and stored[-1]["data"]["status"] == "succeeded"

    pids = {line.split()[0] for line in access_log.read_text().splitlines() if re.search(r"/events ", line)}
    assert len(pids) == 2, f"reconnects were all served by one worker: {pids}"
