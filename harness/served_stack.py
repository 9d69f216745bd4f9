"""The app as it is deployed: real ``gunicorn -k gevent`` servers in front, real Celery workers behind.

Used by the gevent resume test and by the fault harness (``python -m bench.soak``). Everything runs
as child processes of the caller, configured only through the environment it is given::

    with ServedStack(env, directory, servers=2, workers_per_server=1) as stack:
        key = stack.create_app(definition)
        requests.post(f"{stack.urls[0]}/v1/workflows/run", ...)

An in-process Flask app on the same settings creates the tables before the processes race to, and
reads what the processes wrote (run rows, topics) for the caller's checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import time
import types
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Self

import psutil
import requests
from flask import Flask

from harness.processes import BIN, CELERY_APP, ROOT, Worker, free_port, process_env, stop_workers

#: gunicorn's access-log line: worker pid, method, path, status.
ACCESS_LOG_FORMAT = "%(p)s %(m)s %(U)s %(s)s"


class GunicornServer:
    """One ``gunicorn -k gevent`` master serving ``app`` (the API by default) on a free loopback port.

    ``config``: the gunicorn config module (the deployed one by default; ``None`` for gunicorn's own
    defaults, as the Durable Streams gateway is documented to run). ``ready_path``: a path any answer
    to which (any status) means a worker serves.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        directory: pathlib.Path,
        *,
        workers: int = 2,
        name: str = "api",
        extra_args: Sequence[str] = (),
        access_log: bool = True,
        app: str = "api.app:app",
        config: str | None = "python:api.gunicorn_conf",
        ready_path: str = "/v1/workflows/run/x",
    ) -> None:
        self.env = dict(env)
        self.app, self.config, self.ready_path = app, config, ready_path
        self.workers = workers
        #: Without an access log (``ACCESS_LOG=off``: the benchmarks measure without its cost), :meth:`statuses`
        #: knows no answers.
        self.access_log_enabled = access_log
        if not access_log:
            self.env.setdefault("ACCESS_LOG", "off")
        #: More gunicorn options (they win over api/gunicorn_conf.py), e.g. ``--worker-connections``.
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / f"{name}.log"
        self.access_log = directory / f"{name}-access.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self) -> Self:
        self._log = open(self.log_path, "ab")  # noqa: SIM115  (closed in stop())
        self.process = subprocess.Popen(
            [
                str(BIN / "gunicorn"),
                # As deployed (bin/run, compose): worker connections, gc.freeze() after the app is loaded.
                *(("--config", self.config) if self.config else ()),
                "-k",
                "gevent",
                "-w",
                str(self.workers),
                "-b",
                f"127.0.0.1:{self.port}",
                "--graceful-timeout",
                "5",
                # Every master would otherwise bind the one control socket in $HOME, the last one winning.
                "--no-control-socket",
                *(
                    ("--access-logfile", str(self.access_log), "--access-logformat", ACCESS_LOG_FORMAT)
                    if self.access_log_enabled
                    else ()
                ),
                *self.extra_args,
                self.app,
            ],
            cwd=ROOT,
            env=process_env(self.env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 60) -> None:
        """Until every worker is up and one of them answers a request."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited early:\n{self.log_tail()}")
            if len(self.worker_pids()) >= self.workers:
                try:
                    requests.get(f"{self.url}{self.ready_path}", timeout=2)
                    return
                except (requests.ConnectionError, requests.Timeout):
                    pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"gunicorn did not become ready:\n{self.log_tail()}")
            time.sleep(0.1)

    def worker_pids(self) -> list[int]:
        """The live worker processes (the master's children)."""
        if self.process is None or self.process.poll() is not None:
            return []
        with contextlib.suppress(psutil.NoSuchProcess):
            return [
                child.pid
                for child in psutil.Process(self.process.pid).children()
                if child.status() != psutil.STATUS_ZOMBIE
            ]
        return []

    def reload(self) -> None:
        """``kill -HUP`` the master: gunicorn starts new workers, then stops the old ones (SIGTERM, a drain)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGHUP)

    def kill_worker(self, pid: int | None = None) -> int:
        """SIGKILL one worker (not the master, which starts a new one); returns its pid."""
        pid = pid if pid is not None else self.worker_pids()[0]
        os.kill(pid, signal.SIGKILL)
        return pid

    def access_lines(self) -> list[str]:
        """The access log's lines as gunicorn formats them (the message of each JSON line, with JSON logs)."""
        lines = []
        with contextlib.suppress(FileNotFoundError):
            for line in self.access_log.read_text().splitlines():
                if line.startswith("{"):
                    try:
                        line = json.loads(line)["message"]
                    except ValueError:  # the last line, still being written
                        continue
                lines.append(line)
        return lines

    def served(self, path_fragment: str) -> Counter[str]:
        """How many requests whose path contains ``path_fragment`` each worker pid answered."""
        counts: Counter[str] = Counter()
        for line in self.access_lines():
            fields = line.split()
            if len(fields) >= 3 and path_fragment in fields[2]:
                counts[fields[0]] += 1
        return counts

    def statuses(self) -> Counter[int]:
        """HTTP status codes of every request in the access log."""
        counts: Counter[int] = Counter()
        for line in self.access_lines():
            fields = line.split()
            if len(fields) >= 4 and fields[-1].isdigit():
                counts[int(fields[-1])] += 1
        return counts

    def worker_timeouts(self) -> int:
        """How often the master killed a worker that stopped reporting (its gevent hub was blocked)."""
        with contextlib.suppress(FileNotFoundError):
            return self.log_path.read_text(errors="replace").count("WORKER TIMEOUT")
        return 0

    def log_tail(self, size: int = 4000) -> str:
        with contextlib.suppress(FileNotFoundError):
            return self.log_path.read_text(errors="replace")[-size:]
        return ""

    def _wait_stopped(self, timeout: float) -> None:
        """Until the master exits. A worker forked just before the SIGTERM misses it (it has not set its
        handlers yet) and would keep the master waiting out its graceful timeout: each second, the
        workers still running are told again; a worker already stopping ignores the repeat."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.process.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    raise
            for pid in self.worker_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self._wait_stopped(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None


class ServedStack:
    """``servers`` gunicorn masters (``workers_per_server`` gevent workers each) and Celery workers."""

    def __init__(
        self,
        env: Mapping[str, str],
        directory: pathlib.Path,
        *,
        servers: int = 1,
        workers_per_server: int = 2,
        celery_workers: int = 1,
        celery_concurrency: int = 8,
        server_args: Sequence[str] = (),
        celery_app: str = CELERY_APP,
        access_log: bool = True,
        server_config: str | None = "python:api.gunicorn_conf",
    ) -> None:
        self.env = dict(env)
        self.directory = directory
        self.servers = [
            GunicornServer(
                self.env,
                directory,
                workers=workers_per_server,
                name=f"api-{index}",
                config=server_config,
                extra_args=server_args,
                access_log=access_log,
            )
            for index in range(servers)
        ]
        self._celery_app = celery_app
        self.celery: list[Worker] = []
        self._celery_workers = celery_workers
        self._celery_concurrency = celery_concurrency
        self._app: Flask | None = None

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def app(self) -> Flask:
        """An in-process app on the stack's settings (tables, run rows, topics)."""
        if self._app is None:
            from api.app_factory import create_app
            from api.configs import AppConfig

            self._app = create_app(AppConfig(**self.env))  # type: ignore[arg-type]
        return self._app

    def __enter__(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self.app  # noqa: B018  (creates the tables before the processes race to)
            for _ in range(self._celery_workers):
                self.start_worker(self._celery_concurrency, wait=False)
            for server in self.servers:
                server.start()
            for worker in self.celery:
                worker.wait_ready()
            for server in self.servers:
                server.wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()

    def start_worker(self, concurrency: int | None = None, *, wait: bool = True) -> Worker:
        log = self.directory / f"worker-{len(self.celery)}.log"
        worker = Worker(self.env, log, concurrency or self._celery_concurrency, app=self._celery_app)
        self.celery.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def create_app(self, definition: Mapping[str, Any]) -> str:
        """Store a workflow app; return its API key."""
        from api.services import app_service

        with self.app.app_context():
            created = app_service.create_app(definition)
            key: str = created.api_key
            from api.models.engine import db

            db.session.remove()
            return key

    def run_row(self, run_id: str) -> dict[str, Any] | None:
        from api.models import WorkflowRun
        from api.models.engine import db

        with self.app.app_context():
            try:
                run = db.session.get(WorkflowRun, run_id)
                if run is None:
                    return None
                return {column.name: getattr(run, column.name) for column in WorkflowRun.__table__.columns}
            finally:
                db.session.remove()

    def statuses(self) -> Counter[int]:
        """HTTP status codes of every request every server answered."""
        counts: Counter[int] = Counter()
        for server in self.servers:
            counts.update(server.statuses())
        return counts

    def worker_timeouts(self) -> int:
        return sum(server.worker_timeouts() for server in self.servers)

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        stop_workers(self.celery)
        if self._app is not None:
            with self._app.app_context():
                self._app.extensions["durable_stream"].close()
                from api.models.engine import db

                db.engine.dispose()
            self._app = None
