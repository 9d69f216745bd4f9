"""gunicorn's workers on a fresh database all create what is missing of the schema at the same moment:
every one of them comes up (a table another made first is not a start-up failure)."""

from __future__ import annotations

import pathlib

import pytest

from harness.app_env import base_env
from harness.served_stack import GunicornServer

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("attempt", range(2))
def test_four_workers_on_a_fresh_sqlite_database_all_start(tmp_path: pathlib.Path, attempt: int) -> None:
    env = base_env(tmp_path)  # nothing made in this process first: the workers race for every table
    with GunicornServer(env, tmp_path, workers=4) as server:
        log = server.log_tail(200_000)
        assert len(server.worker_pids()) == 4, log[-3000:]
        assert "already exists" not in log and "Worker failed to boot" not in log, log[-3000:]
