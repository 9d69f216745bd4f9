"""Retention and reaping on a schedule: a real ``celery beat`` sends the app's schedule to a real worker
(whose own reaper thread is off), which removes expired run events and ends a run whose worker died."""

from __future__ import annotations

import pathlib
import time

import requests

from api.configs import AppConfig
from api.core.app.apps.topics import workflow_run_topic
from api.extensions.ext_celery import beat_schedule
from api.extensions.ext_durable_stream import durable_stream
from api.models.engine import db
from api.services import app_service
from api.services import workflow_run_service as run_service
from harness.app_env import base_env
from harness.processes import Beat, free_port
from harness.served_stack import ServedStack
from harness.sse import parse_sse
from harness.sse_client import read_run
from harness.waiting import wait_until
from tests.app import examples

GREETING = examples.greeting()
MAX_AGE = 3.0


def test_the_schedule_has_both_sweeps_on_their_own_intervals_and_none_when_zero() -> None:
    schedule = beat_schedule(AppConfig(BEAT_REAPER_INTERVAL=7, BEAT_RETENTION_INTERVAL=11))  # type: ignore[call-arg]
    assert {name: (entry["task"], entry["schedule"]) for name, entry in schedule.items()} == {
        "reap-expired-workflow-runs": ("reap_expired_workflow_runs", 7),
        "enforce-stream-retention": ("enforce_stream_retention", 11),
    }
    assert beat_schedule(AppConfig(BEAT_REAPER_INTERVAL=0, BEAT_RETENTION_INTERVAL=0)) == {}  # type: ignore[call-arg]
    live_only = AppConfig(WORKFLOW_EVENT_TRANSPORT="broadcast_channel", REDIS_URL="redis://x")  # type: ignore[call-arg]
    assert list(beat_schedule(live_only)) == ["reap-expired-workflow-runs"]


def test_beat_scheduled_retention_removes_expired_events_and_a_late_client_gets_410(tmp_path: pathlib.Path) -> None:
    worker_port = free_port()
    env = base_env(
        tmp_path,
        DURABLE_STREAM_MAX_AGE_SECONDS=MAX_AGE,
        # Only beat sweeps: the worker's own reaper thread (reaping and retention) and the API workers'
        # reaper are off (on a busy machine the API's sweep could reach the orphan before beat does).
        WORKFLOW_REAPER_INTERVAL=0,
        API_REAPER_INTERVAL=0,
        DURABLE_STREAM_RETENTION_INTERVAL=0,
        BEAT_RETENTION_INTERVAL=1,
        BEAT_REAPER_INTERVAL=1,
        WORKER_METRICS_BIND=f"127.0.0.1:{worker_port}",
        METRICS_FLUSH_INTERVAL=0.1,
    )
    with ServedStack(env, tmp_path / "stack", servers=1, workers_per_server=1, celery_concurrency=2) as served:
        url = served.urls[0]
        key = served.create_app(GREETING)
        response = requests.post(
            f"{url}/v1/workflows/run",
            headers={"Authorization": f"Bearer {key}"},
            json={"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "streaming"},
            stream=True,
            timeout=30,
        )
        messages = [message for message in parse_sse(response.iter_content(None)) if not message.is_ping]
        task_id, run_id = response.headers["X-Task-Id"], response.headers["X-Workflow-Run-Id"]
        first_id = next(message.id for message in messages if message.id)
        topic = workflow_run_topic("workflow", run_id)

        def retained() -> int:
            with served.app.app_context():
                info = durable_stream().admin.topic_info(topic)
                return 0 if info is None else info.length

        stored = retained()
        assert stored == len(messages)  # the stream is the run's events, nothing else
        expired_at = time.time() + MAX_AGE + 0.5
        wait_until(lambda: time.time() >= expired_at, MAX_AGE + 5, "the run's events are past retention")
        assert retained() == stored, "nothing but beat sweeps retention here"

        # A run whose worker died: running, lease long expired. Beat's reaper sweep must end it.
        with served.app.app_context():
            orphan = run_service.create_run(app_service.authenticate(f"Bearer {key}"), {"name": "n"}, "u2")
            orphan.lease_expires_at = time.time() - 60
            orphan.attempt_started_at = time.time() - 120
            db.session.commit()
            orphan_id = orphan.id
            db.session.remove()

        beat = Beat(served.env, tmp_path / "beat.log")
        try:
            wait_until(lambda: retained() == 0, 30, "beat's retention sweep removed the expired events")
            assert beat.sent("enforce-stream-retention") >= 1
            wait_until(lambda: (served.run_row(orphan_id) or {}).get("status") == "failed", 30, "the orphan failed")
            assert beat.sent("reap-expired-workflow-runs") >= 1
        finally:
            beat.stop()

        late = read_run(url, key, task_id, last_event_id=first_id)
        assert late.status == 410 and late.error is not None and late.error["code"] == "resume_cursor_expired"
        assert late.error["run"]["status"] == "succeeded"

        scrape = f"http://127.0.0.1:{worker_port}/"

        def counted(name: str, **labels: str) -> float:
            from prometheus_client.parser import text_string_to_metric_families

            text = requests.get(scrape, timeout=5).text
            return sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
            )

        wait_until(lambda: counted("workflow_retention_removed_records_total") >= stored, 15, "removals counted")
        assert counted("workflow_retention_sweeps_total", outcome="ok") >= 1
        wait_until(lambda: counted("workflow_run_reaps_total", reason="lease_expired") >= 1, 15, "the reap counted")
