"""A gunicorn config for profiling one API worker in place: ``api.gunicorn_conf`` plus a CPU profile.

``python -m bench.sse --profile-worker DIR`` starts the worker with
``--config python:tools.profile_worker_conf``; each worker then profiles its own CPU time (cProfile on
``time.process_time``, so waiting greenlets cost nothing) in windows of ``PROFILE_WORKER_WINDOW``
seconds (default 20) and writes ``<DIR>/worker-<pid>-<n>.prof`` after each one, for
``python -m pstats`` or ``snakeviz``. Not for production: cProfile slows every Python call.

With ``PROFILE_WORKER_TRACEMALLOC=1`` the worker traces its allocations instead (tracemalloc, 12
frames) and writes ``<DIR>/<name>.snapshot`` whenever a file ``<DIR>/<name>.request`` appears (the
benchmark asks for ``before`` and ``connected``); compare them with ``python -m tools.memory_diff``.
"""

from __future__ import annotations

import cProfile
import os
import pathlib
import time
from typing import Any

from api.gunicorn_conf import post_worker_init as _deployed_post_worker_init
from api.gunicorn_conf import worker_connections

__all__ = ["post_worker_init", "worker_connections"]


def post_worker_init(worker: Any) -> None:
    _deployed_post_worker_init(worker)
    directory = os.environ.get("PROFILE_WORKER_DIR")
    if not directory:
        return
    import gevent

    window = float(os.environ.get("PROFILE_WORKER_WINDOW") or 20)
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    if os.environ.get("PROFILE_WORKER_TRACEMALLOC"):
        gevent.spawn(_snapshots_on_request, out)
        return

    def profile_windows() -> None:
        for index in range(1000):
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            gevent.sleep(window)
            profiler.disable()
            profiler.dump_stats(out / f"worker-{os.getpid()}-{index}.prof")

    gevent.spawn(profile_windows)


def _snapshots_on_request(out: pathlib.Path) -> None:
    import tracemalloc

    import gevent

    tracemalloc.start(12)
    while True:
        for request in out.glob("*.request"):
            import gc

            gc.collect()
            tracemalloc.take_snapshot().dump(str(out / f"{request.stem}.snapshot"))
            request.unlink()
        gevent.sleep(0.5)
