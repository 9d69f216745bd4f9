"""``make run``'s script on the embedded defaults: gunicorn with gevent workers, a Celery worker on the
filesystem broker, SQLite for data and streams; no external service (``DEPLOY_ENV=DEVELOPMENT``, which
the script sets and tells the user to set for ``flask``)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from harness.processes import BIN, ROOT, free_port, process_env
from harness.waiting import wait_until

pytestmark = pytest.mark.slow  # handed out first by make test (tests/conftest.py)


@pytest.fixture
def served(tmp_path: pathlib.Path) -> Iterator[tuple[str, dict[str, str]]]:
    port = free_port()
    env = process_env(
        {"VAR_DIR": str(tmp_path), "PORT": str(port), "WORKFLOW_LLM_TOKEN_DELAY": "0.001", "RESTART_BACKOFF": "0.2"}
    )
    for name in ("SQLALCHEMY_DATABASE_URI", "DURABLE_STREAM_URL", "CELERY_BROKER_URL", "CELERY_QUEUE", "DEPLOY_ENV"):
        env.pop(name, None)
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115  (supervisor_lines reads it)
    process = subprocess.Popen(
        [str(ROOT / "bin" / "run")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"

    def api_answers() -> bool:
        assert process.poll() is None, (tmp_path / "run.log").read_text()
        try:
            requests.get(f"{base}/v1/workflows/run/x", timeout=1)
        except (requests.ConnectionError, requests.Timeout):
            return False
        return True

    try:
        wait_until(api_answers, 60, "the API to come up", interval=0.1)
        yield base, env
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def create_app(env: dict[str, str]) -> dict[str, str]:
    created = subprocess.run(
        [str(BIN / "flask"), "--app", "api.app", "create-app", "--file", "examples/greeting.yml"],
        cwd=ROOT,
        env={**env, "DEPLOY_ENV": "DEVELOPMENT"},
        capture_output=True,
        text=True,
        check=True,
    )
    return {"Authorization": f"Bearer {json.loads(created.stdout)['api_key']}"}


def test_embedded_defaults_serve_a_blocking_and_an_async_run(served: tuple[str, dict[str, str]]) -> None:
    base, env = served
    headers = create_app(env)
    blocking = requests.post(
        f"{base}/v1/workflows/run", json={"inputs": {"name": "Ada"}, "user": "me"}, headers=headers, timeout=60
    )
    assert blocking.status_code == 200, blocking.text
    assert blocking.json()["data"]["status"] == "succeeded"
    started = requests.post(
        f"{base}/v1/workflows/run",
        json={"inputs": {"name": "Bo"}, "user": "me", "response_mode": "async"},
        headers=headers,
        timeout=10,
    ).json()

    def succeeded() -> bool:
        detail = requests.get(
            f"{base}/v1/workflows/run/{started['workflow_run_id']}?user=me", headers=headers, timeout=10
        ).json()
        return bool(detail["status"] == "succeeded")

    wait_until(succeeded, 60, "the async run to succeed", interval=0.1)
    assert (pathlib.Path(env["VAR_DIR"]) / "streams.db").exists() and (pathlib.Path(env["VAR_DIR"]) / "app.db").exists()
    # A healthy start warns about nothing (kombu used to, about the filesystem broker's missing host),
    # and the worker's lines are log records, JSON by default.
    worker_log = (pathlib.Path(env["VAR_DIR"]) / "worker.log").read_text(errors="replace")
    assert "No hostname was supplied" not in worker_log
    records = [json.loads(line) for line in worker_log.splitlines()]
    # (Celery's warning about running as root is a true one: tests run as root here; the image does not.)
    warnings = [r for r in records if r["level"] == "WARNING" and "superuser privileges" not in r["message"]]
    assert records and not warnings, warnings


def supervisor_lines(env: dict[str, str]) -> list[dict[str, Any]]:
    lines = []
    for line in (pathlib.Path(env["VAR_DIR"]) / "run.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("logger") == "bin/run":
                lines.append(record)
    return lines


def running_pid(env: dict[str, str], name: str) -> int | None:
    """The pid of the supervisor's ``name`` process now running (the last one it started)."""
    starts = [line for line in supervisor_lines(env) if line.get("process") == name and "restart_in" not in line]
    deaths = [line for line in supervisor_lines(env) if line.get("process") == name and "restart_in" in line]
    return int(starts[-1]["pid"]) if len(starts) > len(deaths) else None


def deaths_of(env: dict[str, str], pid: int) -> list[dict[str, Any]]:
    return [line for line in supervisor_lines(env) if line.get("pid") == pid and "restart_in" in line]


def run_succeeds(base: str, headers: dict[str, str], name: str) -> None:
    body = {"inputs": {"name": name}, "user": "me", "response_mode": "blocking"}
    answer = requests.post(f"{base}/v1/workflows/run", json=body, headers=headers, timeout=60)
    assert answer.status_code == 200 and answer.json()["data"]["status"] == "succeeded", answer.text


def test_a_killed_worker_and_a_killed_api_are_started_again(served: tuple[str, dict[str, str]]) -> None:
    base, env = served
    headers = create_app(env)
    run_succeeds(base, headers, "Ada")
    for name in ("worker", "api"):
        pid = running_pid(env, name)
        assert pid is not None, supervisor_lines(env)
        os.kill(pid, signal.SIGKILL)
        said = wait_until(lambda pid=pid: deaths_of(env, pid), 30, f"the supervisor to say the {name} died")
        assert said[0]["exit"] == "killed by SIGKILL" and said[0]["level"] == "WARNING", said
        new_pid = wait_until(lambda name=name: running_pid(env, name), 30, f"a new {name}")
        assert new_pid != pid
        # A run started right away waits for the new process (the API's port, the worker's queue) and succeeds.
        wait_until(lambda: requests_ok(f"{base}/health/live"), 60, "the API to answer again", interval=0.1)
        run_succeeds(base, headers, f"After {name}")
    restarts = [line for line in supervisor_lines(env) if "restart_in" in line]
    assert [line["process"] for line in restarts] == ["worker", "api"] and all(
        line["restart_in"] == 0.2 for line in restarts
    ), "each one's first restart waits the initial back-off"


def requests_ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False
