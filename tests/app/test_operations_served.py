"""Operating the deployed processes (real ``gunicorn -k gevent`` and a real Celery worker): their
Prometheus metrics, each scraped on its own bind while runs stream, resume, expire and fail, and
their JSON log lines."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from api.core.app.apps.topics import workflow_run_topic
from api.extensions.ext_durable_stream import durable_stream
from harness.app_env import base_env
from harness.processes import Worker, free_port
from harness.served_stack import GunicornServer, ServedStack
from harness.sse import parse_sse
from harness.sse_client import read_run
from harness.waiting import wait_until
from tests.app import examples

GREETING = examples.greeting()


class Scraper:
    def __init__(self, url: str) -> None:
        self.url = url

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        text = requests.get(self.url, timeout=5).text
        return [
            (sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
        return sum(
            value
            for sample, sample_labels, value in self.samples()
            if sample == name and all(sample_labels.get(key) == wanted for key, wanted in labels.items())
        )

    def has(self, name: str, **labels: str) -> bool:
        """Whether a sample called ``name`` with ``labels`` is exported at all (at 0, say)."""
        return any(
            sample == name and all(sample_labels.get(key) == wanted for key, wanted in labels.items())
            for sample, sample_labels, _ in self.samples()
        )

    def wait_for(self, name: str, minimum: float, **labels: str) -> float:
        wait_until(lambda: self.value(name, **labels) >= minimum, timeout=15, what=f"{name}{labels} >= {minimum}")
        return self.value(name, **labels)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServedStack, Scraper, Scraper]]:
    directory: pathlib.Path = tmp_path_factory.mktemp("metrics")
    api_port, worker_port = free_port(), free_port()
    env = base_env(
        directory,
        API_METRICS_BIND=f"127.0.0.1:{api_port}",
        WORKER_METRICS_BIND=f"127.0.0.1:{worker_port}",
        METRICS_FLUSH_INTERVAL=0.1,
        LOG_FORMAT="json",
        LOG_LEVEL="DEBUG",
    )
    with ServedStack(env, directory / "stack", servers=1, workers_per_server=2, celery_concurrency=2) as served:
        yield served, Scraper(f"http://127.0.0.1:{api_port}/metrics"), Scraper(f"http://127.0.0.1:{worker_port}/")


def _stream(url: str, key: str, definition_inputs: dict[str, Any] | None = None) -> tuple[str, list[Any]]:
    response = requests.post(
        f"{url}/v1/workflows/run",
        headers={"Authorization": f"Bearer {key}"},
        json={"inputs": definition_inputs or {"name": "Ada"}, "user": "u1", "response_mode": "streaming"},
        stream=True,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    messages = [message for message in parse_sse(response.iter_content(None)) if not message.is_ping]
    return response.headers["X-Task-Id"], messages


def test_counters_move_as_runs_stream_resume_expire_and_fail(stack: tuple[ServedStack, Scraper, Scraper]) -> None:
    served, api, worker = stack
    url = served.urls[0]
    key = served.create_app(GREETING)

    # A run streams: the worker appends and finishes it, the API reads, delivers and measures the lag.
    task_id, messages = _stream(url, key)
    assert messages[-1].json["event"] == "workflow_finished"
    assert all("\x1e" not in message.data for message in messages), "the envelope never reaches a client"
    worker.wait_for("workflow_runs_finished_total", 1, status="succeeded")
    appended = worker.wait_for("durable_stream_appends_total", len(messages) - 1, backend="sqlite", outcome="ok")
    assert worker.value("durable_stream_append_seconds_count", backend="sqlite") >= appended
    api.wait_for("workflow_event_delivery_lag_seconds_count", 1, transport="durable_stream")
    assert api.value("workflow_event_delivery_lag_seconds_bucket", transport="durable_stream", le="+Inf") >= 1
    api.wait_for("durable_stream_records_read_total", len(messages) - 1, backend="sqlite")
    wait_until(lambda: api.value("workflow_sse_streams_open") == 0, 15, "the stream is counted closed")
    assert api.value("durable_stream_subscriptions_open") == 0

    # A healthy system shows every known label at 0, and each role only its own families.
    for scraper in (api, worker):
        assert scraper.has("workflow_run_reaps_total", reason="lease_expired")
        assert scraper.has("durable_stream_unavailable_total", backend="sqlite")
    assert api.has("workflow_sse_resumes_total", outcome="run_events_lost")
    assert worker.has("workflow_retention_sweeps_total", outcome="failed")
    assert not worker.has("workflow_sse_streams_open") and not api.has("workflow_watchdog_stops_total")

    # A late reader from the run's start: an attach, whose events are a replay, not delivery lag.
    lag_before = api.value("workflow_event_delivery_lag_seconds_count", transport="durable_stream")
    whole = read_run(url, key, task_id)
    assert whole.status == 200 and whole.ended == "finished"
    api.wait_for("workflow_sse_resumes_total", 1, outcome="attached")
    api.wait_for("workflow_sse_replayed_events_total", len(messages), transport="durable_stream")
    assert api.value("workflow_event_delivery_lag_seconds_count", transport="durable_stream") == lag_before

    # Resumes: after an event (replaying the rest), with a forged token, for an unknown task.
    ids = [message.id for message in messages if message.id]
    resumed = read_run(url, key, task_id, last_event_id=ids[0])
    assert resumed.status == 200 and resumed.ended == "finished"
    api.wait_for("workflow_sse_resumes_total", 1, outcome="resumed")
    replayed = api.wait_for("durable_stream_subscription_backlog_records_sum", len(ids) - 1, start="cursor")
    assert replayed >= len(ids) - 1
    assert read_run(url, key, task_id, last_event_id="AQ" + ids[0][2:-2] + "zz").status == 400
    api.wait_for("workflow_sse_resumes_total", 1, outcome="invalid_resume_token")
    assert read_run(url, key, "0" * 8 + "-0000-0000-0000-" + "0" * 12).status == 404
    api.wait_for("workflow_sse_resumes_total", 1, outcome="not_found")

    # Retention passes the client: its token is genuine but its position is gone.
    with served.app.app_context():
        durable_stream().admin.trim_topic(workflow_run_topic("workflow", messages[0].json["workflow_run_id"]), 1)
    expired = read_run(url, key, task_id, last_event_id=ids[0])
    assert expired.status == 410 and expired.error is not None and expired.error["code"] == "resume_cursor_expired"
    api.wait_for("workflow_sse_resumes_total", 1, outcome="resume_cursor_expired")
    api.wait_for("durable_stream_cursor_unavailable_total", 1, backend="sqlite", reason="trimmed")

    # A run fails (its model errs): counted by terminal status on the worker.
    failing = copy.deepcopy(GREETING)
    failing = examples.script_model(failing, error_after_tokens=2)
    failing = examples.script_model(failing, error="model overloaded")
    _, failed = _stream(url, served.create_app(failing))
    assert failed[-1].json["data"]["status"] == "failed"
    worker.wait_for("workflow_runs_finished_total", 1, status="failed")
    # Every sample either exporter shows is one the app declares (the dashboard test relies on it).
    from api.libs.metrics import exported_names

    shown = {name for name, _, _ in api.samples() + worker.samples()}
    assert shown <= exported_names() | {name.removesuffix("_total") + "_created" for name in shown}


def test_log_lines_about_a_run_are_json_with_its_ids_and_carry_no_payload_or_token(
    stack: tuple[ServedStack, Scraper, Scraper],
) -> None:
    served, _, _ = stack
    url = served.urls[0]
    key = served.create_app(GREETING)
    secret_input = "Zq-input-7731"
    task_id, messages = _stream(url, key, {"name": secret_input})
    run_id = messages[0].json["workflow_run_id"]
    ids = [message.id for message in messages if message.id]
    assert len(ids) >= 3
    auth = {"Authorization": f"Bearer {key}"}
    resumed = requests.get(f"{url}/v1/workflow/{task_id}/events?user=u1&last_event_id={ids[1]}", headers=auth)
    assert resumed.status_code == 200
    assert read_run(url, key, task_id, last_event_id=ids[2][:-4] + "AAAA").status == 400
    worker_log, api_log = served.celery[0].log_path, served.servers[0].log_path

    def about_run() -> list[str]:
        text = worker_log.read_text(errors="replace") + api_log.read_text(errors="replace")
        return [line for line in text.splitlines() if run_id in line]

    wait_until(lambda: [line for line in about_run() if "attempt ended" in line], 15, "the worker logs the attempt")
    wait_until(lambda: [line for line in about_run() if "refused" in line], 15, "the API logs the refused token")
    lines = about_run()
    assert len(lines) >= 3
    for line in lines:
        record = json.loads(line)  # every line about the run is one JSON object
        assert {"ts", "level", "logger", "message"} <= record.keys(), line
        assert record["workflow_run_id"] == run_id and record["task_id"] == task_id, line
        if not record["logger"].startswith("celery."):  # Celery's own lines know the ids, not the app
            assert record["transport"] == "durable_stream" and record["app_id"], line

    # Every line of the API's log is JSON, gunicorn's own included; Celery's lines about the run's task
    # carry the run's ids (its Celery task id is the run's task_id).
    def parsed(path: pathlib.Path) -> list[dict[str, Any] | None]:
        records: list[dict[str, Any] | None] = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                records.append(None)
        return records

    api_records = parsed(api_log)
    assert api_records and None not in api_records, [line for line in api_log.read_text().splitlines()[:5]]
    assert any(record and record["logger"].startswith("gunicorn.") for record in api_records)
    assert all(record is not None for record in parsed(served.servers[0].access_log)[:-1])
    celery = [
        record
        for record in parsed(worker_log)
        if record is not None and record["logger"].startswith("celery.") and record.get("task_id") == task_id
    ]
    assert any("received" in record["message"] for record in celery), celery
    assert all(record["workflow_run_id"] == run_id for record in celery)
    assert not [r for r in parsed(worker_log) if r is None], worker_log.read_text()[:3000]
    everything = "".join(
        path.read_text(errors="replace") for path in (worker_log, api_log, served.servers[0].access_log)
    )
    assert key not in everything, "an API key was logged"
    assert secret_input not in everything, "a run's input or an event payload was logged"
    assert "wonderful day" not in everything, "an event payload was logged"
    leaked = [token for token in ids if token in everything]
    assert not leaked, "resume tokens were logged"


def test_a_prefork_worker_serves_what_its_pool_processes_count(tmp_path: pathlib.Path) -> None:
    """Celery's prefork pool: the tasks run in forked children; the main process serves their sum."""
    worker_port = free_port()
    env = base_env(tmp_path, WORKER_METRICS_BIND=f"127.0.0.1:{worker_port}", METRICS_FLUSH_INTERVAL=0.1)
    with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_workers=0) as served:
        served.celery.append(Worker(served.env, tmp_path / "prefork.log", 2, pool="prefork"))
        served.celery[-1].wait_ready()
        worker = Scraper(f"http://127.0.0.1:{worker_port}/")
        key = served.create_app(GREETING)
        appended = 0
        for _ in range(2):
            _, messages = _stream(served.urls[0], key)
            assert messages[-1].json["data"]["status"] == "succeeded"
            # The worker appends all but the start; a run's count of text chunks varies (graphon's filter
            # may let held-back text out in fewer, longer chunks), so each run's own events are counted.
            appended += len(messages) - 1
        worker.wait_for("workflow_runs_finished_total", 2, status="succeeded")
        worker.wait_for("durable_stream_appends_total", appended, backend="sqlite", outcome="ok")
        # Files per process (counter_<pid>.db, …): the runs were counted by pool children.
        writers = {int(path.stem.rpartition("_")[2]) for path in (tmp_path / "metrics" / "worker").glob("*.db")}
        assert writers - {served.celery[-1].process.pid}, f"only the main process wrote metrics: {writers}"


def test_api_requests_are_counted_by_route_and_status_and_every_family_is_there_from_the_start(
    stack: tuple[ServedStack, Scraper, Scraper],
) -> None:
    served, api, worker = stack
    url = served.urls[0]
    # Families a dashboard panel or an alert reads exist at 0 before anything happened to them.
    assert api.has("durable_streams_gateway_requests_total", method="GET", status="200")
    assert api.has("durable_streams_gateway_request_seconds_bucket", method="PUT")
    assert worker.has("workflow_worker_heartbeats_total", outcome="failed")
    assert api.has("workflow_task_sends_total", send="again", outcome="ok")
    key = served.create_app(GREETING)
    _stream(url, key)
    assert requests.get(f"{url}/no/such/route", timeout=5).status_code == 404
    route = {"method": "POST", "route": "/v1/workflows/run", "status": "200"}
    api.wait_for("workflow_http_requests_total", 1, **route)
    api.wait_for("workflow_http_requests_total", 1, method="GET", route="unmatched", status="404")
    api.wait_for("workflow_http_request_seconds_count", 1, method="POST", route="/v1/workflows/run")
    api.wait_for("workflow_task_sends_total", 1, send="first", outcome="ok")
    # The worker's consumer answers its own pings: it consumes.
    worker.wait_for("workflow_worker_heartbeats_total", 1, outcome="ok")


def test_a_gunicorn_worker_that_exits_writes_one_json_line(tmp_path: pathlib.Path) -> None:
    env = base_env(tmp_path, LOG_FORMAT="json")
    with GunicornServer(env, tmp_path, workers=1) as server:
        assert requests.get(f"{server.url}/health/live", timeout=5).status_code == 200
        first = server.worker_pids()
        os.kill(first[0], signal.SIGTERM)  # its master starts another
        wait_until(lambda: server.worker_pids() and server.worker_pids() != first, 30, "a new worker")
        wait_until(lambda: requests_ok(f"{server.url}/health/live"), 30, "the new worker to answer")
    lines = server.log_path.read_text(errors="replace").splitlines()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"a line that is not JSON: {line!r}\n" + "\n".join(lines[-20:])) from None
    exits = [record for record in records if record["message"].startswith("Worker exiting")]
    assert len(exits) == 2, "one line for the replaced worker's exit, one for its successor's at the stop"


def requests_ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except (requests.ConnectionError, requests.Timeout):
        return False


def test_a_forms_answer_and_token_never_reach_a_log(stack: tuple[ServedStack, Scraper, Scraper]) -> None:
    served, _, _ = stack
    url = served.urls[0]
    key = served.create_app(GREETING)
    auth = {"Authorization": f"Bearer {key}"}
    body = {"inputs": {"name": "Ada", "mood": "formal"}, "user": "u1", "response_mode": "blocking"}
    paused = requests.post(f"{url}/v1/workflows/run", json=body, headers=auth, timeout=60).json()
    token = paused["data"]["reasons"][0]["form_token"]
    secret = "Qx-answer-5519"
    answer = {"inputs": {"approved": "true", "note": secret}, "action": "submit", "user": "u1"}
    assert requests.post(f"{url}/v1/form/human_input/{token}", json=answer, headers=auth, timeout=30).ok
    run_id = paused["workflow_run_id"]
    done = f"run {run_id}: attempt ended (succeeded)"  # the resumed attempt's, not the paused one's
    wait_until(lambda: done in served.celery[0].log_path.read_text(errors="replace").replace('"', ""), 30, "the end")
    logs = [served.celery[0].log_path, served.servers[0].log_path, served.servers[0].access_log]
    everything = "".join(path.read_text(errors="replace") for path in logs)
    assert "resume_app_execution" in everything, "the worker logged the resume task it received"
    assert secret not in everything and token not in everything
