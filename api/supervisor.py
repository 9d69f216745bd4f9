"""``bin/run``'s supervisor: the API (gunicorn) and a Celery worker, each started again when it dies.

A process that exits while the supervisor is not stopping is started again after a back-off (``--backoff``
seconds, doubled after each restart up to ``--backoff-max``; back to ``--backoff`` once a process has
stayed up for ``--stable-after`` seconds), and the supervisor says so: one JSON line on stderr per start
and per exit, with the process's name, pid, how it ended and when it starts again. Before the restart,
whatever the dead process left of its process group (a gunicorn master's workers) is stopped, so the
new one finds its port free. SIGINT or SIGTERM stops every process (SIGTERM, then SIGKILL after
``--stop-timeout``) and ends the supervisor.

    python -m api.supervisor --child NAME LOG COMMAND [--child ...]

``LOG`` is a file the child's output is appended to, or ``-`` for the supervisor's own stdout/stderr.
Nothing here imports the app: the children are whole processes of their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

#: How often the supervisor looks at its children and the clock.
TICK = 0.1


@dataclasses.dataclass
class Child:
    name: str
    argv: list[str]
    log: pathlib.Path | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = 0.0
    due: float | None = 0.0


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class Supervisor:
    def __init__(
        self,
        children: Sequence[Child],
        *,
        backoff: float = 1.0,
        backoff_max: float = 30.0,
        stable_after: float = 60.0,
        stop_timeout: float = 10.0,
        out: IO[str] | None = None,
    ) -> None:
        self.children = list(children)
        self.initial_backoff, self.backoff_max = backoff, backoff_max
        self.stable_after, self.stop_timeout = stable_after, stop_timeout
        self.out = out or sys.stderr
        self.stopping = False
        for child in self.children:
            child.backoff = backoff

    def say(self, level: str, message: str, **fields: Any) -> None:
        line = {
            "ts": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "level": level,
            "logger": "bin/run",
            "message": message,
            **fields,
        }
        self.out.write(json.dumps(line) + "\n")
        self.out.flush()

    def start(self, child: Child) -> None:
        output: Any = None
        if child.log is not None:
            output = open(child.log, "ab")  # noqa: SIM115  (the child holds it; ours closes right after)
        try:
            # A session of its own: the child's workers are its group, stopped with it.
            child.process = subprocess.Popen(child.argv, stdout=output, stderr=output, start_new_session=True)
        finally:
            if output is not None:
                output.close()
        child.started_at, child.due = time.monotonic(), None
        again = f" (restart {child.restarts})" if child.restarts else ""
        pid = child.process.pid
        self.say(
            "INFO", f"started the {child.name} (pid {pid}){again}", process=child.name, pid=pid, restarts=child.restarts
        )

    def _stop_group(self, pid: int, timeout: float, leader: subprocess.Popen[bytes] | None = None) -> None:
        """SIGTERM the process group ``pid`` leads, then SIGKILL what is left after ``timeout``.

        ``leader``, the group's leader if it is still our child, is reaped while we wait: until then it
        stays in its group as a zombie, and the group would look alive for the whole ``timeout``.
        """
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if leader is not None:
                    leader.poll()
                try:
                    os.killpg(pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(TICK)

    def _exited(self, child: Child, code: int) -> None:
        assert child.process is not None
        pid = child.process.pid
        child.process = None
        self._stop_group(pid, self.stop_timeout)  # its orphans (a gunicorn master's workers)
        if time.monotonic() - child.started_at >= self.stable_after:
            child.backoff = self.initial_backoff
        delay = child.backoff
        child.backoff = min(self.backoff_max, child.backoff * 2)
        child.restarts += 1
        child.due = time.monotonic() + delay
        how = describe_exit(code)
        message = f"the {child.name} (pid {pid}) died ({how}); starting it again in {delay:g} s"
        self.say(
            "WARNING",
            f"{message} (restart {child.restarts})",
            process=child.name,
            pid=pid,
            exit=how,
            restart_in=delay,
            restarts=child.restarts,
        )

    def step(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.process is not None:
                code = child.process.poll()
                if code is not None and not self.stopping:
                    self._exited(child, code)
            elif child.due is not None and now >= child.due and not self.stopping:
                self.start(child)

    def stop_all(self) -> None:
        self.stopping = True
        for child in self.children:
            if child.process is not None:
                self._stop_group(child.process.pid, self.stop_timeout, child.process)
                code = child.process.wait()
                self.say("INFO", f"stopped the {child.name} ({describe_exit(code)})", process=child.name)
                child.process = None

    def run(self) -> int:
        def stop(signum: int, _frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            while not self.stopping:
                self.step()
                time.sleep(TICK)
        finally:
            self.stop_all()
        return 0


def parse(argv: Sequence[str]) -> tuple[list[Child], argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m api.supervisor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, action="append", metavar=("NAME", "LOG", "COMMAND"), required=True)
    parser.add_argument("--backoff", type=float, default=1.0)
    parser.add_argument("--backoff-max", type=float, default=30.0)
    parser.add_argument("--stable-after", type=float, default=60.0)
    parser.add_argument("--stop-timeout", type=float, default=10.0)
    options = parser.parse_args(argv)
    children = [
        Child(name, shlex.split(command), None if log == "-" else pathlib.Path(log))
        for name, log, command in options.child
    ]
    return children, options


def main(argv: Sequence[str] | None = None) -> int:
    children, options = parse(sys.argv[1:] if argv is None else argv)
    supervisor = Supervisor(
        children,
        backoff=options.backoff,
        backoff_max=options.backoff_max,
        stable_after=options.stable_after,
        stop_timeout=options.stop_timeout,
    )
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
