"""A small soak: scenarios 1 to 3 of ``python -m bench.soak`` through the same code, with small numbers
and the same invariants (the full figures are in ``docs/reliability.md``); and what the soak found."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable, Iterator

import pytest

from bench.soak import api_kill, celery_kill, storm
from bench.soak.services import Services, services
from tests.app.conftest import AppHarness
from tests.app.test_events_sse import reconnect
from tests.app.test_run_always_ends import assert_gone, ended, has_text, row, start_async
from tests.app.test_service_api import slow_greeting
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until


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


def test_an_end_repaired_after_the_store_lost_the_run_is_not_shown_as_the_whole_run(
    make_harness: Callable[..., AppHarness],
) -> None:
    """Found by the soak (store-restart, Redis without persistence, at-end-long).

    The store restarts empty while the run's end is pending; the reaper then writes the end into a
    new incarnation of the topic. A reader without ``Last-Event-ID`` must get 410 ``run_events_lost``
    (the run's events are gone), not a 200 whose "whole run" is a synthetic ``workflow_started``
    followed by ``workflow_finished``.
    """
    with RedisServer(appendonly=False) as store:
        harness = make_harness(
            DURABLE_STREAM_URL=f"{store.url}?key_prefix=lost:",
            WORKFLOW_END_RETRY_DEADLINE=1,
            WORKFLOW_REAPER_INTERVAL=0.5,
        )
        key = harness.create_app(slow_greeting(delay=0.02, tokens=400))["api_key"]
        run = start_async(harness, key)
        run_id = run["workflow_run_id"]
        wait_until(lambda: has_text(harness, run_id), 30, "the run to stream")
        store.kill()
        wait_until(lambda: row(harness, run_id)["status"] == "failed", 20, "the worker to record the failure")
        time.sleep(2.0)  # the store stays away past the worker's retry deadline: the end is pending
        store.start()  # empty: no persistence
        wait_until(lambda: ended(harness, run_id), 30, "the reaper to write the pending end")
        assert_gone(reconnect(harness, key, run["task_id"], "u1"), "run_events_lost", run_id)
