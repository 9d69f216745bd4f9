"""Keep CPU cores busy, as another job on a shared CI machine would: ``python -m tools.cpu_hog [--cores N]``.

``make test-loaded`` runs ``make test`` beside it, so that a test which holds only on an idle machine
fails here rather than on a user's busy one. Each core is one process spinning at normal priority
(what ``stress-ng --cpu N`` does, without installing it). The hog runs until it gets SIGTERM or SIGINT,
or ``--seconds`` pass; its spinners also stop on their own within ``--check-interval`` seconds of the
hog's death (a ``kill -9`` included), so none outlives the check that started it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["main", "spin"]


def spin(parent: int, check_interval: float) -> None:
    """Burn one core until ``parent`` is no longer this process's parent (it died or it stopped us)."""
    # The hog's handlers came with the fork: without these, its terminate() would not stop us.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the hog, which stops us
    next_check = time.monotonic() + check_interval
    value = 0
    while True:
        for _ in range(10_000):
            value = (value * 1_103_515_245 + 12_345) & 0xFFFFFFFF
        if time.monotonic() >= next_check:
            if os.getppid() != parent:
                return
            next_check = time.monotonic() + check_interval


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cpu_hog", description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2, help="cores to keep busy (default 2)")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long (default: until signalled)")
    parser.add_argument(
        "--check-interval", type=float, default=0.5, help="how often a spinner checks that the hog is alive (s)"
    )
    args = parser.parse_args(argv)
    if args.cores < 1 or args.check_interval <= 0:
        parser.error("--cores must be at least 1 and --check-interval positive")

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    context = multiprocessing.get_context("fork")
    spinners = [
        context.Process(target=spin, args=(os.getpid(), args.check_interval), daemon=True) for _ in range(args.cores)
    ]
    for spinner in spinners:
        spinner.start()
    print(f"cpu_hog: {args.cores} spinning processes {[s.pid for s in spinners]}", file=sys.stderr, flush=True)
    try:
        stop.wait(args.seconds)
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
