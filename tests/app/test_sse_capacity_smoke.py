"""A small ``python -m bench.sse``: real gunicorn (one gevent worker), Celery, a private redis-server.

Only correctness is asserted here (the figures are the benchmark's): every probe event reaches every
client exactly once and in order, every stream ends with ``workflow_finished``, nothing answers an
error, and in the durable mode the API worker's Redis connections do not grow with the clients (they
share one listener and a pool used per read, not a connection per stream).
"""

from __future__ import annotations

import pathlib

import pytest

from bench.sse import measure
from harness.redis_server import redis_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not redis_available(), reason="needs redis-server"),
]

#: The most Redis connections one API worker opens whatever its clients: the durable-stream adapter's
#: command and read pools (16 + 3) and change feed (1), and the app's own client's few.
FIXED_POOLS = 24
SMALL = {"runs": 10, "tokens": 6, "rate": 6.0, "idle_seconds": 1.0, "load_processes": 2}


def _assert_all_delivered(row: dict[str, object]) -> None:
    assert row["error_count"] == 0, row["errors"]
    assert row["connected"] == row["clients"]
    assert row["received"] == row["expected"], (row["received"], row["expected"])


def test_every_client_gets_every_event_once_and_redis_connections_do_not_grow(tmp_path: pathlib.Path) -> None:
    few = measure("durable", 50, directory=tmp_path / "few", **SMALL)  # type: ignore[arg-type]
    many = measure("durable", 200, directory=tmp_path / "many", **SMALL)  # type: ignore[arg-type]
    _assert_all_delivered(few)
    _assert_all_delivered(many)
    # The same 10 runs followed by 4x the clients: no Redis connection per client. The worker's
    # connections are its pools' (the adapter's 16 for commands, 3 for reads, its change feed, the
    # app's own client), filled as far as the busiest moment needed, which varies from run to run.
    assert many["redis_connections_worker"] <= max(few["redis_connections_worker"] + 2, FIXED_POOLS), (few, many)


def test_broadcast_mode_delivers_to_200_clients(tmp_path: pathlib.Path) -> None:
    row = measure("broadcast", 200, directory=tmp_path / "broadcast", **SMALL)  # type: ignore[arg-type]
    _assert_all_delivered(row)
    # One subscription connection per client, as the broadcast channel is built.
    assert row["redis_connections_worker"] >= 200
