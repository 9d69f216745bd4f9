"""A small ``python -m bench.sse --scenario herd``: real gunicorn (one gevent worker), Celery, a private
redis-server, clients arriving on streaming runs in Dify's mix (half tail, a quarter cursor, a quarter
snapshot).

Only correctness is asserted here (the figures are the benchmark's): every client is served and gets
every event after its start exactly once, tail clients included (no gap in a stream, no duplicate).
"""

from __future__ import annotations

import pathlib

import pytest

from bench.sse_herd import measure_scenario
from harness.redis_server import redis_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not redis_available(), reason="needs redis-server"),
]


def test_a_mixed_herd_gets_every_event_after_its_start_once(tmp_path: pathlib.Path) -> None:
    clients = 60
    row = measure_scenario(
        "herd",
        clients,
        arrival_rate=100.0,
        runs=4,
        rate=1.0,
        warmup=4.0,  # every run has probes to give cursors from
        level_wait=3.0,
        steady=1.0,
        load_processes=1,
        directory=tmp_path,
    )
    assert row["start"] == "mix 50/25/25"
    by_start = row["by_start"]
    assert {kind: figures["clients"] for kind, figures in by_start.items()} == {
        "tail": 30,
        "cursor": 15,
        "snapshot": 15,
    }
    assert row["served"] + row["refused_then_served"] == clients, row["failures"]
    assert (row["missing"], row["duplicated"], row["out_of_order"]) == (0, 0, 0)
    assert (row["clients_with_fewer_events"], row["clients_with_more_events"], row["unfinished"]) == (0, 0, 0)
    for kind, figures in by_start.items():
        assert (figures["missing"], figures["duplicated"], figures["failed"]) == (0, 0, 0), (kind, figures)
    # Every tail client's first stream had probes (the runs stream for seconds after the arrival), so
    # each has a start lag. Its size (stale starts) is the benchmark's figure: it grows with how far
    # the run's writer is behind when the client joins, which a busy shared machine decides.
    assert by_start["tail"]["streams_with_a_probe"] >= 30
    assert row["server_5xx"] == 0
