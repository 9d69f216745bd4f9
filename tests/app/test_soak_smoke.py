"""A small soak: scenarios 1 to 3 of ``python -m bench.soak`` through the same code, with small numbers
and the same invariants (the full figures are in ``docs/reliability.md``). What the soak found has its
regression test with the others in ``test_run_always_ends.py``."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from bench.soak import api_kill, celery_kill, storm
from bench.soak.services import Services, services

# make bench's (pytest -m soak), not make test's: each scenario's regression tests run in make test
# (test_run_always_ends.py; an API worker killed mid-stream in tests/sdk/test_resume.py).
pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def found() -> Iterator[Services]:
    """A private Redis (broker, Redis streams, broadcast channel) for the module's scenarios."""
    with services() as found:
        yield found


@pytest.mark.timeout(90)
@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_disconnect_storm_loses_repeats_and_reorders_nothing(
    found: Services, tmp_path: pathlib.Path, store: str
) -> None:
    options = storm.StormOptions(stores=(store,), runs=20, concurrency=10, celery_concurrency=10)
    table = storm.run(found, tmp_path, options)
    assert not table.problems, table.markdown()
    (result,) = table.data
    assert result["finished"] == 20
    assert result["reconnects"] >= 20 * options.drops
    assert (result["lost"], result["duplicated"], result["reordered"], result["foreign"]) == (0, 0, 0, 0)
    assert all(int(count) > 0 for count in str(result["reconnects per server"]).split(" / ")), result


@pytest.mark.timeout(110)
def test_a_killed_celery_worker_s_started_and_prefetched_runs_all_end(found: Services, tmp_path: pathlib.Path) -> None:
    options = celery_kill.CeleryKillOptions(brokers=("redis",), runs=6, tokens=100)
    table = celery_kill.run(found, tmp_path, options)
    assert not table.problems, table.markdown()
    (result,) = table.data
    assert result["runs (started / prefetched / queued)"] == "2 / 4 / 0"
    assert result["ended"] == 6 and result["clients finished"] == 6 and result["exact copies"] == 6
    assert result["ends (started / prefetched / queued)"] == "2 failed / 4 succeeded / -"


@pytest.mark.timeout(90)
def test_killing_an_api_worker_mid_stream_loses_and_repeats_nothing(found: Services, tmp_path: pathlib.Path) -> None:
    options = api_kill.ApiKillOptions(stores=("sqlite",), runs=10, wave=10, tokens=200, celery_concurrency=10)
    table = api_kill.run(found, tmp_path, options)
    assert not table.problems, table.markdown()
    (result,) = table.data
    assert result["kills"] == 1 and result["clients cut"] >= 1 and result["finished"] == 10
    assert (result["lost"], result["duplicated"], result["reordered"]) == (0, 0, 0)
