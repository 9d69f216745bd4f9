"""``bin/run``'s supervisor stops its children as soon as they are gone, not after its stop timeout."""

from __future__ import annotations

import signal
import subprocess
import sys

from harness.processes import ROOT

STOP_TIMEOUT = 20.0  # --stop-timeout: what a child that ignores SIGTERM would be given

# A child that exits at once on SIGTERM, after saying it is up.
CHILD = f"{sys.executable} -c \"import time; print('up', flush=True); time.sleep(600)\""


def test_sigterm_stops_children_that_exit_without_waiting_out_the_stop_timeout() -> None:
    # Before the fix, each stopped child's group looked alive while its leader was an unreaped zombie:
    # the supervisor waited the whole stop timeout (and 5 s more after a SIGKILL) for every child.
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "api.supervisor",
            "--stop-timeout",
            str(STOP_TIMEOUT),
            *("--child", "one", "-", CHILD),
            *("--child", "two", "-", CHILD),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as supervisor:
        try:
            assert supervisor.stdout is not None and supervisor.stderr is not None
            # Both children have started (their own output comes through ours; the two may interleave).
            seen = ""
            while seen.count("up") < 2:
                line = supervisor.stdout.readline()
                assert line, f"the supervisor's output ended before both children were up: {seen!r}"
                seen += line
            supervisor.send_signal(signal.SIGTERM)
            # Both children exit on SIGTERM at once; one stop timeout is less than one child used to cost.
            code = supervisor.wait(timeout=STOP_TIMEOUT)
            said = supervisor.stderr.read()
        finally:
            if supervisor.poll() is None:
                supervisor.kill()
                supervisor.wait()
    assert code == 0, said
    assert said.count('"stopped the ') == 2, said
    assert "killed by SIGTERM" in said, said
