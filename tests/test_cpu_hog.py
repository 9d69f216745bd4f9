"""tools/cpu_hog.py, the load beside ``make test-loaded``: it burns the cores it is given and leaves nothing behind."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from harness.processes import ROOT
from harness.waiting import wait_until

#: How often a spinner checks that its hog lives: the tests' deadlines are multiples of it.
CHECK = 0.2


@contextlib.contextmanager
def hog(*args: str) -> Iterator[tuple[subprocess.Popen[str], list[psutil.Process]]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tools.cpu_hog", "--check-interval", str(CHECK), *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        started = re.search(r"\[([\d, ]+)\]", process.stderr.readline())
        assert started, "the hog did not say which processes spin"
        yield process, [psutil.Process(int(pid)) for pid in started.group(1).split(",")]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


def _gone(spinners: list[psutil.Process]) -> bool:
    return not any(spinner.is_running() and spinner.status() != psutil.STATUS_ZOMBIE for spinner in spinners)


def test_each_spinner_burns_cpu_and_sigterm_stops_them_all() -> None:
    with hog("--cores", "2") as (process, spinners):
        assert len(spinners) == 2
        for spinner in spinners:
            # CPU time, not wall time: on a machine this busy a spinner still gets some.
            wait_until(lambda spinner=spinner: spinner.cpu_times().user >= 10 * CHECK, 600 * CHECK, "a spinner's CPU")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=50 * CHECK) == 0
        wait_until(lambda: _gone(spinners), 50 * CHECK, "the spinners to stop")


@pytest.mark.parametrize("how", ["kill -9", "--seconds"])
def test_the_spinners_never_outlive_their_hog(how: str) -> None:
    with hog("--cores", "1", *(("--seconds", str(5 * CHECK)) if how == "--seconds" else ())) as (process, spinners):
        if how == "kill -9":
            process.kill()
        # Killed, the hog cannot stop them: each notices within a check interval that its parent is gone.
        process.wait(timeout=50 * CHECK)
        wait_until(lambda: _gone(spinners), 50 * CHECK, "the spinners to stop")
