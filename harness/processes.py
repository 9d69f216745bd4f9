"""Starting and stopping the real processes the app tests run against (Celery workers, gunicorn)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from harness.zygote import Forked, die_with_parent, fork_celery, forking_enabled

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
#: The Celery app the workers run (a benchmark may pass its own module that wraps it).
CELERY_APP = "api.celery_entrypoint:celery"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def end_server(process: subprocess.Popen[bytes], still_answers: Callable[[], bool], timeout: float) -> None:
    """Wait for a server told to stop (SIGKILL it after ``timeout``), then until its port stops answering."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)
    deadline = time.monotonic() + timeout
    while still_answers() and time.monotonic() < deadline:
        time.sleep(0.01)


def terminate(process: subprocess.Popen[bytes] | Forked, timeout: float = 20) -> None:
    """SIGTERM a Celery process and wait for its warm shutdown; SIGKILL it after ``timeout``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def process_env(overrides: Mapping[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "EXPECT_GEVENT"}
    env.update(overrides)
    env["PYTHONPATH"] = str(ROOT)
    return env


class Worker:
    """A real ``celery worker`` process (thread pool, or ``pool="prefork"``) consuming the test's queue."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: pathlib.Path,
        concurrency: int = 4,
        *,
        app: str = CELERY_APP,
        pool: str = "threads",
    ) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115  (closed in stop())
        queue = env["CELERY_QUEUE"]
        argv = [
            str(BIN / "celery"),
            "-A",
            app,
            "--quiet",  # no banner: every line of the log is a log record (JSON with LOG_FORMAT=json)
            "worker",
            "--pool",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            queue,
            "-n",
            f"{queue}-{time.monotonic_ns()}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "-l",
            "info",
        ]
        #: A ``subprocess.Popen``, or a child of the test process's zygote (``harness.zygote``) answering the same.
        self.process: subprocess.Popen[bytes] | Forked
        if forking_enabled(pool):
            self.process = fork_celery(argv, process_env(env), str(ROOT), str(log_path))
        else:
            self.process = subprocess.Popen(
                argv, cwd=ROOT, env=process_env(env), stdout=self._log, stderr=subprocess.STDOUT
            )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker exited early:\n{self.log_path.read_text()[-3000:]}")
            if b" ready." in self.log_path.read_bytes():
                return
            time.sleep(0.05)
        raise TimeoutError(f"the worker did not become ready:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: the worker dies without a word, as on an OOM kill."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        terminate(self.process)
        self._log.close()


def stop_workers(workers: Iterable[Worker]) -> None:
    """Stop several workers at once: each warm shutdown takes a second or more (the filesystem broker's
    poll ends first), so all are told before any is waited for."""
    workers = list(workers)
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        # A second SIGTERM in the middle of a warm shutdown would interrupt it: wait, as terminate() would.
        try:
            worker.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait(timeout=10)
        worker.stop()


@contextlib.contextmanager
def running_worker(env: Mapping[str, str], log_path: pathlib.Path, concurrency: int = 4) -> Iterator[Worker]:
    worker = Worker(env, log_path, concurrency)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


def run_script(script: str, timeout: float = 60) -> tuple[dict[str, Any], str]:
    """Run ``script`` in a fresh interpreter (one that gevent may patch first, say) from the project root.

    Returns the JSON object that its last line of output prints, and what it wrote to stderr.
    """
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report, done.stderr


class Beat:
    """A real ``celery beat`` process sending the app's schedule (``api.extensions.ext_celery.beat_schedule``)."""

    def __init__(self, env: Mapping[str, str], log_path: pathlib.Path, *, app: str = CELERY_APP) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115  (closed in stop())
        self.process = subprocess.Popen(
            [str(BIN / "celery"), "-A", app, "--quiet", "beat", "-l", "info"],
            cwd=ROOT,
            env=process_env(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )

    def sent(self, entry: str) -> int:
        """How often beat has sent the schedule entry called ``entry``."""
        return self.log_path.read_text(errors="replace").count(f"Sending due task {entry} ")

    def stop(self) -> None:
        terminate(self.process)
        self._log.close()
