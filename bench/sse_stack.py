"""What the SSE benchmarks share: the stack's settings, the open-files limit and the load processes.

``bench/sse.py`` (the capacity mode and the CLI) and ``bench/sse_herd.py`` (herds and deploys) both
import from here, so imports between them go one way (``sse`` → ``sse_herd`` → ``sse_stack``).
"""

from __future__ import annotations

import json
import math
import pathlib
import resource
import subprocess
import sys
from typing import Any

from harness.app_env import base_env
from harness.processes import ROOT, process_env
from harness.redis_server import RedisServer

#: The ``user`` of every run and every stream the benchmarks open.
USER = "bench"
#: File descriptors a load process keeps for itself besides its clients' sockets (interpreter,
#: pipes, the event loop's own, the sockets of clients reconnecting while the old one closes).
LOAD_PROCESS_SPARE_FILES = 512


def raise_open_files() -> int:
    """Raise this process's soft open-files limit to its hard one (children inherit it); the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def load_processes_for(clients: int, requested: int, open_files: int) -> int:
    """How many load processes hold ``clients`` sockets: ``requested``, or more when each would need
    more descriptors than ``open_files`` (the hard limit every child inherits) allows.

    Raises:
        ValueError: ``open_files`` leaves no room for a single client in a process.
    """
    room = open_files - LOAD_PROCESS_SPARE_FILES
    if room <= 0:
        raise ValueError(f"an open-files limit of {open_files} leaves no room for clients")
    return max(requested, math.ceil(clients / room))


def stack_env(
    var_dir: pathlib.Path,
    redis: RedisServer,
    mode: str,
    clients: int,
    extra: dict[str, str] | None = None,
    stream_url: str | None = None,
) -> dict[str, str]:
    settings: dict[str, Any] = {
        "DURABLE_STREAM_URL": stream_url or f"redis://127.0.0.1:{redis.port}/0",
        "REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
        # Every broadcast stream holds a connection of the worker's pool: size it for all of them.
        "REDIS_MAX_CONNECTIONS": clients + 100,
        "CELERY_BROKER_URL": f"redis://127.0.0.1:{redis.port}/1",
        # Production-like timings (the test profile's are short): run checks every 10 s per idle
        # stream, pings every 10 s, stop flag cached for 1 s.
        "WORKFLOW_LEASE_TTL": 30,
        "WORKFLOW_STOP_CHECK_INTERVAL": 1.0,
        "WORKFLOW_REAPER_INTERVAL": 10,
        "APP_MAX_EXECUTION_TIME": 900,
        "SSE_PING_INTERVAL": 10,
        "SSE_IDLE_TIMEOUT": 600,
        # Every client is one end user of one app: the open-stream limits are counted (their cost is the
        # deployment's) but set above the herd.
        "LIMIT_SSE_STREAMS_PER_END_USER": 2 * clients + 100,
        "LIMIT_SSE_STREAMS_PER_KEY": 2 * clients + 100,
    }
    if mode == "broadcast":
        settings.update(EVENT_BUS_TRANSPORT="broadcast_channel", BROADCAST_CHANNEL_TYPE="pubsub")
    settings.update(extra or {})
    return base_env(var_dir, **settings)


def start_load_processes(
    module: str, job: dict[str, Any], key: str, items: list[Any], processes: int
) -> list[subprocess.Popen[str]]:
    """Up to ``processes`` children running ``module``, each sent ``job`` with its share of ``items``
    (as ``job[key]``) as one JSON line on its stdin; their stdout is a pipe of text lines."""
    children = []
    for index in range(processes):
        share = items[index::processes]
        if not share:
            continue
        child = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=process_env({}),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        child.stdin.write(json.dumps({**job, key: share}) + "\n")
        child.stdin.flush()
        children.append(child)
    return children
