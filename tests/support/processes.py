"""Starting and stopping the real processes the app tests run against (Celery workers, gunicorn)."""

from __future__ import annotations

import contextlib
import http.client
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def process_env(overrides: Mapping[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "EXPECT_GEVENT"}
    env.update(overrides)
    env["PYTHONPATH"] = str(ROOT)
    return env


class Worker:
    """A real ``celery worker`` process (thread pool) consuming the test's queue."""

    def __init__(self, env: Mapping[str, str], log_path: pathlib.Path, concurrency: int = 4) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115  (closed in stop())
        queue = env["CELERY_QUEUE"]
        self.process = subprocess.Popen(
            [
                str(BIN / "celery"),
                "-A",
                "api.celery_entrypoint:celery",
                "worker",
                "--pool",
                "threads",
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
            ],
            cwd=ROOT,
            env=process_env(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
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
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


@contextlib.contextmanager
def running_gunicorn(
    env: Mapping[str, str], log_dir: pathlib.Path, workers: int = 2, access_log: pathlib.Path | None = None
) -> Iterator[str]:
    """``gunicorn -k gevent api.app:app`` on a free port; yields its base URL once it answers."""
    port = free_port()
    access = (
        ["--access-logfile", str(access_log), "--access-logformat", "%(p)s %(m)s %(U)s %(s)s"] if access_log else []
    )
    log_path = log_dir / "gunicorn.log"
    with open(log_path, "ab") as log:
        server = subprocess.Popen(
            [
                str(BIN / "gunicorn"),
                "-k",
                "gevent",
                "-w",
                str(workers),
                "-b",
                f"127.0.0.1:{port}",
                *access,
                "api.app:app",
            ],
            cwd=ROOT,
            env=process_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            _wait_until_answering(server, port, log_path)
            yield f"http://127.0.0.1:{port}"
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def _wait_until_answering(server: subprocess.Popen[bytes], port: int, log_path: pathlib.Path) -> None:
    """Until a worker has loaded the app and answers (the master listens before its workers boot)."""
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited early:\n{log_path.read_text()[-3000:]}")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            connection.request("GET", "/")
            connection.getresponse().read()
            return
        except (OSError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gunicorn did not answer:\n{log_path.read_text()[-3000:]}") from None
            time.sleep(0.1)
        finally:
            connection.close()


@contextlib.contextmanager
def running_worker(env: Mapping[str, str], log_path: pathlib.Path, concurrency: int = 4) -> Iterator[Worker]:
    worker = Worker(env, log_path, concurrency)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()
