"""Herds: clients arriving at once onto a live run start from its shared writer's history (one read of
the run per process, not one each), exactly after their ``Last-Event-ID`` or from the run's start;
and a worker that cannot take another stream says so before any work (503 ``server_busy``)."""

from __future__ import annotations

import concurrent.futures
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from harness.app_env import base_env
from harness.redis_server import RedisServer, free_port
from harness.served_stack import ServedStack
from harness.sse import parse_sse
from harness.waiting import wait_until
from tests.app.test_drain import read, stored
from tests.app.test_operations_served import Scraper
from tests.app.test_service_api import GREETING, slow_greeting

pytestmark = pytest.mark.timeout(180)

CLIENTS = 120
ARRIVALS = "workflow_sse_arrivals_total"
READ = "durable_stream_records_read_total"
LOOKUPS = "workflow_sse_run_lookups_total"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedStack, Scraper]]:
    directory: pathlib.Path = tmp_path_factory.mktemp("herd")
    port = free_port()
    env = base_env(directory, API_METRICS_BIND=f"127.0.0.1:{port}", METRICS_FLUSH_INTERVAL=0.1, SSE_PING_INTERVAL=1)
    with ServedStack(env, directory / "stack", servers=1, workers_per_server=1, celery_concurrency=2) as served:
        yield served, Scraper(f"http://127.0.0.1:{port}/metrics")


def first_ids(url: str, key: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """The first ``count`` events of a run with their ids, read from its start and then let go."""
    found: list[tuple[str, dict[str, Any]]] = []
    with requests.get(url, headers={"Authorization": f"Bearer {key}"}, stream=True, timeout=30) as response:
        assert response.status_code == 200, response.text
        for message in parse_sse(response.iter_content(None)):
            if message.is_ping or message.event is not None:
                continue
            found.append((message.id or "", message.json))
            if len(found) == count:
                break
    return found


def test_a_herd_onto_a_live_run_starts_from_its_writer_and_reads_the_run_once(
    stack: tuple[ServedStack, Scraper],
) -> None:
    served, scraper = stack
    key = served.create_app(slow_greeting(delay=0.02, tokens=300))  # about 6 s of text
    url = served.urls[0]
    run_id = requests.post(
        f"{url}/v1/workflows/run",
        json={"inputs": {"name": "herd"}, "user": "u1", "response_mode": "async"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()["workflow_run_id"]
    events_url = f"{url}/v1/workflow/{run_id}/events?user=u1"
    wait_until(lambda: len(stored(served, run_id)) > 40, 30, "the run to be streaming")
    anchors = first_ids(f"{events_url}&include_state_snapshot=true", key, 30)
    scraper.wait_for(ARRIVALS, 1, path="shared")  # the reader of the anchors, counted before the herd
    shared_before, alone_before, read_before = (
        scraper.value(ARRIVALS, path="shared"),
        scraper.value(ARRIVALS, path="alone"),
        scraper.value(READ),
    )

    def arrive(index: int) -> tuple[int | None, list[dict[str, Any]]]:
        if index % 2:  # half resume after an event of the run's first 30, half replay it whole
            position = index % len(anchors)
            events, _, _ = read(events_url, key, last_event_id=anchors[position][0])
            return position, events
        events, _, _ = read(f"{events_url}&include_state_snapshot=true", key)
        return None, events

    def intrude(index: int) -> int:
        """Another user of the app, or the run's user with another app's key, while the herd is served
        from the writer's copy of the run's row: never let in by that copy."""
        other_user = f"{url}/v1/workflow/{run_id}/events?user=u2&include_state_snapshot=true"
        if index % 2:
            return requests.get(other_user, headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code
        own = f"{events_url}&include_state_snapshot=true"
        return requests.get(own, headers={"Authorization": f"Bearer {other_key}"}, timeout=30).status_code

    other_key = served.create_app(slow_greeting(delay=0.02, tokens=3))
    with concurrent.futures.ThreadPoolExecutor(CLIENTS + 21) as pool:  # all at once, while the run streams
        # A client that follows the run throughout keeps its writer (and the writer's copy of the run's
        # row) in place for the herd, as the clients already there do in a deployment.
        holder = pool.submit(read, f"{events_url}&include_state_snapshot=true", key)
        scraper.wait_for(ARRIVALS, shared_before + 1, path="shared")
        intruders = [pool.submit(intrude, index) for index in range(20)]
        copies = list(pool.map(arrive, range(CLIENTS)))
        assert [intruder.result() for intruder in intruders] == [404] * 20
        copies.append((None, holder.result()[0]))

    run = stored(served, run_id)
    assert run[-1]["event"] == "workflow_finished"
    for position, events in copies:
        if position is None:
            assert events == run, "a client replaying the run got another copy than the stored run"
        else:
            assert anchors[position][1] == run[position]
            assert events == run[position + 1 :], "a resumed client's copy is not exactly what followed its id"
    # Every client arrived at the run's writer; the store was read about once for all of them (the
    # writer's pass, not one replay each: that would be over CLIENTS * 20 records).
    shared = scraper.wait_for(ARRIVALS, shared_before + CLIENTS + 1, path="shared") - shared_before
    assert shared == CLIENTS + 1
    assert scraper.value(ARRIVALS, path="alone") == alone_before
    assert scraper.value(READ) - read_before < 3 * len(run)
    # ... and the run's row: a copy its writer keeps, not a query each (one read per 2 s at most; here
    # nearly every arrival, with a margin for a slow machine).
    assert scraper.wait_for(LOOKUPS, CLIENTS // 2, source="writer") >= CLIENTS // 2
    assert 500 not in served.statuses()


def test_a_worker_with_streams_stuck_starting_refuses_more_before_any_work(tmp_path: pathlib.Path) -> None:
    with RedisServer() as store:
        env = base_env(tmp_path, DURABLE_STREAM_URL=store.url, SSE_MAX_STARTING="1", SSE_BUSY_RETRY_AFTER_MAX="3")
        with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=1) as served:
            key = served.create_app(slow_greeting(delay=0.001, tokens=5))
            url = served.urls[0]
            headers = {"Authorization": f"Bearer {key}"}
            run_id = requests.post(
                f"{url}/v1/workflows/run",
                json={"inputs": {"name": "busy"}, "user": "u1", "response_mode": "async"},
                headers=headers,
                timeout=30,
            ).json()["workflow_run_id"]
            # Waited for through its row: this API process must not have read (and cached) its events.
            wait_until(
                lambda: (
                    requests.get(f"{url}/v1/workflows/run/{run_id}", headers=headers, timeout=30).json()["status"]
                    == "succeeded"
                ),
                30,
                "the run to succeed",
            )
            events_url = f"{url}/v1/workflow/{run_id}/events?user=u1"
            snapshot_url = f"{events_url}&include_state_snapshot=true"
            assert store.process is not None
            store.process.send_signal(signal.SIGSTOP)  # the next stream's start waits on the store
            try:
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    stuck = pool.submit(requests.get, snapshot_url, headers=headers, timeout=30)

                    def refused() -> dict[str, Any] | None:  # (a Response of a 503 is falsy)
                        response = requests.get(events_url, headers=headers, timeout=30)
                        return dict(response.json()) if response.status_code == 503 else None

                    answer = wait_until(refused, 10, "a stream to be refused while another one starts")
                    assert answer["code"] == "server_busy"
                    waits = {int(refused_answer(events_url, headers).headers["Retry-After"]) for _ in range(20)}
                    # Refused before any work: a run that does not exist is not even looked up.
                    assert refused_answer(f"{url}/v1/workflow/nope/events?user=u1", headers).json()["code"] == (
                        "server_busy"
                    )
                    store.process.send_signal(signal.SIGCONT)
                    assert stuck.result().status_code in (200, 503)  # served, or the store's own timeout
            finally:
                store.process.send_signal(signal.SIGCONT)
            assert waits <= {1, 2, 3} and len(waits) > 1, waits  # spread, so that a herd comes back spread
            assert requests.get(snapshot_url, headers=headers, timeout=30).status_code == 200  # admitted again
            assert 500 not in served.statuses()


def refused_answer(url: str, headers: dict[str, str]) -> requests.Response:
    response = requests.get(url, headers=headers, timeout=30)
    assert response.status_code == 503, response.text
    return response


def test_a_worker_at_its_open_stream_limit_refuses_more_and_takes_them_once_one_ends(
    tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    # A client that leaves a parked stream is noticed at the writer's next write to it: its ping.
    ping = 0.5
    env = base_env(tmp_path, SSE_MAX_STREAMS="2", SSE_BUSY_RETRY_AFTER_MAX="3", SSE_PING_INTERVAL=str(ping))
    with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=1) as served:
        key = served.create_app(GREETING)
        url = served.urls[0]
        headers = {"Authorization": f"Bearer {key}"}
        run_id = requests.post(
            f"{url}/v1/workflows/run",
            json={"inputs": {"name": "full", "mood": "formal"}, "user": "u1", "response_mode": "async"},
            headers=headers,
            timeout=30,
        ).json()["workflow_run_id"]
        wait_until(lambda: stored(served, run_id), 30, "the run to start")
        events_url = f"{url}/v1/workflow/{run_id}/events?user=u1&continue_on_pause=true"
        # Two streams open (a run waiting for its form keeps them open), one from the tail, one replaying.
        first = requests.get(events_url, headers=headers, stream=True, timeout=30)
        second = requests.get(f"{events_url}&include_state_snapshot=true", headers=headers, stream=True, timeout=30)
        request.addfinalizer(first.close)
        request.addfinalizer(second.close)
        assert (first.status_code, second.status_code) == (200, 200)
        refused = requests.get(events_url, headers=headers, timeout=30)
        assert refused.status_code == 503 and refused.json()["code"] == "server_busy", refused.text
        assert 3 <= int(refused.headers["Retry-After"]) <= 30
        first.close()  # its client leaves: the worker counts the stream as ended
        # Streams count until the server closes their body: the one admitted here too.
        again = wait_until(
            lambda: ok_or_none(requests.get(events_url, headers=headers, stream=True, timeout=30)),
            40 * ping,
            "a stream admitted once one ended",
        )

        again.close()
        second.close()
        assert 500 not in served.statuses()


def test_a_gunicorn_worker_admits_at_most_what_it_can_hold(tmp_path: pathlib.Path) -> None:
    """Without SSE_MAX_STREAMS, a worker's limit is 95% of its connections or of its open files."""
    env = base_env(tmp_path, WEB_WORKER_CONNECTIONS="1000")
    with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=1) as served:
        log = served.servers[0].log_tail(100_000)
        assert "admission: at most 950 event streams open in this worker" in log, log[-2000:]


def ok_or_none(response: requests.Response) -> requests.Response | None:
    if response.status_code == 200:
        return response
    response.close()
    return None
