"""Many clients at once: each one follows its run in a thread of a bounded pool."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

from harness.sse_client import FollowedRun


def follow_all(clients: Sequence[Callable[[], FollowedRun]], concurrency: int) -> list[FollowedRun]:
    """Run every client, at most ``concurrency`` at a time; results in the order given."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="client") as pool:
        futures = [pool.submit(client) for client in clients]
        return [future.result() for future in futures]
