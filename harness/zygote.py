"""Celery workers for the tests, forked from an interpreter that has already imported them.

A ``celery worker`` costs about two CPU-seconds to start, nearly all of it imports (graphon's pydantic
models, SQLAlchemy, Flask, Celery), and the app tests start some 170 of them. So each test process keeps
one *zygote*: a separate interpreter, started once, that imports what every worker imports and then only
forks. Each child is a process of its own that runs Celery's command line (``celery.__main__.main``)
with its own argv, environment, working directory and log, exactly as the ``celery`` script would: the
entry point module, which builds the app from the settings in the environment, is imported by the child.
A child is signalled, stopped, killed and waited for like any other process (:class:`Forked` answers as
much of ``subprocess.Popen`` as the harness uses); the zygote reaps it and reports its exit code.

Only what does not depend on the settings is imported beforehand. Three things stay out (the zygote
refuses to start if a preload drags one in): the entry point itself; ``prometheus_client``, which decides
at import whether it counts for several processes (``PROMETHEUS_MULTIPROC_DIR``, set by the worker's
metrics); and gevent's monkey-patching, which must come before the modules it patches — a gevent or
eventlet pool is always started with ``exec``. ``HARNESS_WORKER_START=exec`` starts every worker that way.

Run as ``python -m harness.zygote``: requests are JSON lines on stdin, answers are lines on stdout
(``ready``, ``started <pid>``, ``exited <pid> <exit code>``). When stdin closes (the test process ended)
the zygote SIGKILLs the children still alive and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MUST_NOT_PRELOAD", "PRELOAD", "Forked", "Zygote", "die_with_parent", "fork_celery", "forking_enabled"]

#: What every worker imports whatever its settings (measured with ``python -X importtime``).
PRELOAD = (
    "celery.__main__",
    "celery.bin.celery",
    "celery.bin.worker",
    "celery.apps.worker",
    "celery.worker.consumer",
    "celery.concurrency.thread",
    "celery.concurrency.prefork",
    "kombu.transport.redis",
    "api.app_factory",
    "api.startup",
    "api.tasks",
    "api.extensions.ext_logging",
    "api.extensions.ext_metrics",
)
#: Modules that must be imported by the child, after its settings are in place (see the module docstring).
MUST_NOT_PRELOAD = ("api.celery_entrypoint", "prometheus_client", "gevent.monkey", "eventlet")
#: Pools that patch the interpreter before anything is imported: never forked from the zygote.
EXEC_POOLS = frozenset({"gevent", "eventlet"})


def forking_enabled(pool: str) -> bool:
    return pool not in EXEC_POOLS and os.environ.get("HARNESS_WORKER_START", "fork") != "exec"


# -- the zygote process ---------------------------------------------------------------------------------


def _write(fd: int, line: str) -> None:
    # os.write, not sys.stdout: a child forked while a buffered writer held its lock would inherit it held.
    os.write(fd, (line + "\n").encode())


def die_with_parent() -> None:
    """``preexec_fn`` of a server child (and what a zygote's child does first): SIGKILL it when its parent
    dies (``PR_SET_PDEATHSIG``), so an interrupted run leaves no server behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _child(request: Mapping[str, Any]) -> int:
    """What a forked child runs instead of the zygote's loop; returns its exit code."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    die_with_parent()  # the zygote SIGKILLs its children when it ends; this covers its own SIGKILL
    if request.get("new_session"):
        os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for name in os.listdir("/proc/self/fd"):  # as subprocess's close_fds: only 0, 1 and 2 go on
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):
                os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's own streams, as at start-up)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    from celery.__main__ import main

    try:
        main()
        return 0
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1


def _run_child(request: Mapping[str, Any]) -> None:
    code = 1
    try:
        code = _child(request)
    except BaseException:  # a child never returns into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            import atexit

            atexit._run_exitfuncs()  # as an interpreter's exit would: logging flushes its handlers
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF)


def serve() -> None:
    """The zygote: import, say ``ready``, then fork one child per request until stdin closes."""
    answers = os.dup(1)
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = sorted(set(MUST_NOT_PRELOAD) & sys.modules.keys())
    if leaked:
        _write(answers, f"refused preloading imported {', '.join(leaked)}")
        sys.exit(3)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    pending = b""
    _write(answers, "ready")
    while True:
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
        while children:  # reap whatever ended, signal or not (a wake-up may be coalesced with another)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _write(answers, f"exited {pid} {os.waitstatus_to_exitcode(status)}")
        if 0 not in readable:
            continue
        data = os.read(0, 65536)
        if not data:
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            children.add(pid)
            _write(answers, f"started {pid}")


# -- the test process's side ----------------------------------------------------------------------------


class Zygote:
    """This test process's zygote: started on first use, asked for children one at a time."""

    def __init__(self) -> None:
        root = pathlib.Path(__file__).resolve().parents[1]
        # Its own environment matters to no child (each gets the one it asks for); gevent is not expected.
        env = {key: value for key, value in os.environ.items() if key != "EXPECT_GEVENT"} | {"PYTHONPATH": str(root)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "harness.zygote"],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # No PR_SET_PDEATHSIG: it fires when the *thread* that started the zygote ends, which may be any
            # test's helper thread. The zygote ends with this process all the same: its stdin closes.
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin, self._stdout = self.process.stdin, self.process.stdout
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._started: list[int] = []
        self._exited: dict[int, int] = {}
        self._ready = False
        self._gone = False
        self._said = ""
        threading.Thread(target=self._read, name="zygote-answers", daemon=True).start()
        self._wait_for(lambda: self._ready, 120, "the zygote to import the worker's modules")

    def _read(self) -> None:
        for raw in self._stdout:
            word, _, rest = raw.decode().strip().partition(" ")
            with self._changed:
                if word == "ready":
                    self._ready = True
                elif word == "started":
                    self._started.append(int(rest))
                elif word == "exited":
                    pid, code = rest.split()
                    self._exited[int(pid)] = int(code)
                else:  # its last words, e.g. a preload it refused: said when it ends
                    self._said = raw.decode().strip()
                self._changed.notify_all()
        with self._changed:
            self._gone = True
            self._changed.notify_all()

    def _wait_for(self, done: Any, timeout: float | None, what: str) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: done() or self._gone, timeout):
                raise subprocess.TimeoutExpired("harness.zygote", timeout or 0)
            if not done():
                raise RuntimeError(f"the zygote ended before {what} (exit code {self.process.wait()}) {self._said}")

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, log: str, new_session: bool) -> int:
        request = {"argv": list(argv), "env": dict(env), "cwd": cwd, "log": log, "new_session": new_session}
        with self._lock:
            self._stdin.write(json.dumps(request).encode() + b"\n")
            self._stdin.flush()
            self._wait_for(lambda: self._started, 60, "it forked a worker")
            with self._changed:
                return self._started.pop(0)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        if timeout == 0:
            with self._changed:
                return self._exited.get(pid)
        self._wait_for(lambda: pid in self._exited, timeout, f"process {pid} ended")
        return self._exited[pid]

    def close(self, timeout: float = 30) -> None:
        """End the zygote as the test process's end would (its stdin closes): its children are killed."""
        self._stdin.close()
        self.process.wait(timeout=timeout)
        with self._changed:
            self._changed.wait_for(lambda: self._gone, timeout)
        self._stdout.close()

    def alive(self) -> bool:
        return self.process.poll() is None


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def _the_zygote() -> Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive():
            _zygote = Zygote()
        return _zygote


class Forked:
    """A child of the zygote, answering what the harness asks of a ``subprocess.Popen``."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._zygote.exit_code(self.pid, timeout)
            assert code is not None
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_celery(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, log: str, *, new_session: bool = False
) -> Forked:
    """Start ``celery <argv[1:]>`` as a child of this test process's zygote, its output appended to ``log``."""
    zygote = _the_zygote()
    return Forked(zygote, zygote.fork(argv, env, cwd, log, new_session))


if __name__ == "__main__":
    serve()
