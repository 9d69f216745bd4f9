"""The tests' Celery workers are forked from a zygote that has imported them (``harness.zygote``): each is
still a process of its own, with the settings of its own environment, killed and waited for like any other."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import psutil
import pytest

from harness.app_env import base_env
from harness.processes import ROOT, Worker, process_env
from harness.waiting import wait_until
from harness.zygote import MUST_NOT_PRELOAD, PRELOAD, Forked, Zygote, forking_enabled


@pytest.fixture(autouse=True)
def _forking() -> None:
    if not forking_enabled("threads"):
        pytest.skip("HARNESS_WORKER_START=exec: workers are not forked")


def test_a_forked_worker_reads_its_settings_from_its_own_environment(tmp_path: pathlib.Path) -> None:
    refused = Worker(base_env(tmp_path, SECRET_KEY="short-secret"), tmp_path / "refused.log", 1)
    with pytest.raises(RuntimeError, match="exited early"):
        refused.wait_ready()
    assert refused.process.wait(timeout=30) != 0
    log = (tmp_path / "refused.log").read_text()
    assert "configuration error: SECRET_KEY is 12 bytes long" in log and "Traceback" not in log
    refused.stop()

    # The next child of the same zygote is not the worse for it.
    env = base_env(tmp_path)
    served = Worker(env, tmp_path / "served.log", 1)
    try:
        served.wait_ready()
        assert f"{env['CELERY_QUEUE']}-" in (tmp_path / "served.log").read_text()
    finally:
        served.stop()
    assert served.process.returncode == 0


def test_a_forked_worker_is_signalled_and_reaped_like_any_process(tmp_path: pathlib.Path) -> None:
    worker = Worker(base_env(tmp_path), tmp_path / "worker.log", 1)
    worker.wait_ready()
    assert isinstance(worker.process, Forked)
    process = psutil.Process(worker.process.pid)
    assert process.ppid() != os.getpid() and process.pid != os.getpid()
    worker.process.send_signal(signal.SIGSTOP)
    wait_until(lambda: process.status() == psutil.STATUS_STOPPED, 10, "the worker to stop")
    assert worker.process.poll() is None
    worker.process.send_signal(signal.SIGCONT)
    worker.kill()
    assert worker.process.returncode == -signal.SIGKILL
    worker.stop()


def test_the_zygote_takes_its_children_with_it_when_the_test_process_ends(tmp_path: pathlib.Path) -> None:
    zygote = Zygote()
    try:
        pid = zygote.fork(
            [
                str(pathlib.Path(sys.executable).parent / "celery"),
                "-A",
                "api.celery_entrypoint:celery",
                "--quiet",
                "worker",
                "--pool",
                "threads",
                "-c",
                "1",
                "-Q",
                base_env(tmp_path)["CELERY_QUEUE"],
                "-l",
                "info",
            ],
            process_env(base_env(tmp_path)),
            str(ROOT),
            str(tmp_path / "orphan.log"),
            False,
        )
        log = tmp_path / "orphan.log"  # made by the child once forked
        wait_until(lambda: log.exists() and b" ready." in log.read_bytes(), 60, "the worker to be ready")
    finally:
        zygote.close()
    wait_until(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
        10,
        "the worker to die with its zygote",
    )


def test_the_zygote_imports_nothing_that_must_see_a_workers_settings_first() -> None:
    script = (
        "import importlib, sys\n"
        f"for name in {PRELOAD!r}: importlib.import_module(name)\n"
        f"print(sorted(set({MUST_NOT_PRELOAD!r}) & sys.modules.keys()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=process_env({}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
