"""A broker that is gone for a while loses no user action: a start, a form's answer and a stop made while
it is away are kept (the task outbox) and take effect exactly once when it is back; a message it held and
lost (a Redis restarted without persistence, a broker folder moved away) is sent again.
"""

from __future__ import annotations

import pathlib
import shutil
from collections.abc import Callable, Iterator

import pytest

from api.models import TaskOutbox
from api.models.engine import db
from harness.redis_server import RedisServer
from harness.waiting import wait_until
from tests.app.conftest import AppHarness
from tests.app.crash_steps import FAST, Workers, assert_once, outbox_size, row, wait_ended
from tests.app.test_crash_safety import FORM_ANSWER, pause_run, post, start_async


def tried_and_failed(harness: AppHarness) -> int:
    """Kept messages that a dispatcher took a turn on (their due time moved on) without a broker taking them."""
    with harness.app.app_context():
        try:
            rows = db.session.query(TaskOutbox).all()
            return sum(1 for r in rows if r.sends == 0 and r.due_at > r.created_at + FAST["WORKFLOW_DISPATCH_GRACE"])
        finally:
            db.session.remove()


@pytest.fixture
def broker_server() -> Iterator[RedisServer]:
    server = RedisServer()  # no persistence: a restart comes back empty, as a crashed cache would
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def on_private_broker(
    make_harness: Callable[..., AppHarness], broker_server: RedisServer
) -> Iterator[tuple[AppHarness, Workers]]:
    harness = make_harness(start_worker=False, **FAST, CELERY_BROKER_URL=broker_server.url)
    workers = Workers(harness)
    try:
        yield harness, workers
    finally:
        workers.stop_all()


def test_actions_made_while_the_broker_is_away_take_effect_once_it_is_back(
    on_private_broker: tuple[AppHarness, Workers], broker_server: RedisServer
) -> None:
    harness, workers = on_private_broker
    key = harness.create_app("greeting")["api_key"]
    workers.start(concurrency=2)
    paused_id, token = pause_run(harness, key)
    paused_to_stop, _ = pause_run(harness, key)
    broker_server.stop()
    started = start_async(harness, key)["workflow_run_id"]  # 202: kept, not sent
    post(harness, key, f"/v1/form/human_input/{token}", FORM_ANSWER)  # 200: the answer is taken
    stopped_task = row(harness, paused_to_stop).task_id
    post(harness, key, f"/v1/workflows/tasks/{stopped_task}/stop", {"user": "u1"})
    queued_task = start_async(harness, key, "Queued")
    post(harness, key, f"/v1/workflows/tasks/{queued_task['task_id']}/stop", {"user": "u1"})
    assert row(harness, started).queued_at is None and row(harness, paused_id).queued_at is None
    assert outbox_size(harness) == 2, "the start and the answer wait in the outbox; the stops needed none"
    # The outage lasts until the dispatcher (the worker's sweeps) has tried each kept message and failed.
    wait_until(lambda: tried_and_failed(harness) == 2, 20, "the dispatcher to try while the broker is away")
    broker_server.start()
    assert_once(wait_ended(harness, started, "succeeded"))
    assert_once(wait_ended(harness, paused_id, "succeeded"), resumed=True)
    for stopped in (paused_to_stop, queued_task["workflow_run_id"]):
        names = wait_ended(harness, stopped, "stopped")
        assert names.count("workflow_finished") == 1, names
    assert workers.attempts_started(started) == 1 and workers.attempts_started(paused_id, resumed=True) == 1
    assert workers.attempts_started(queued_task["workflow_run_id"]) == 0
    wait_until(lambda: outbox_size(harness) == 0, 10, "the outbox to empty")


def test_a_message_the_broker_lost_is_sent_again(
    on_private_broker: tuple[AppHarness, Workers], broker_server: RedisServer
) -> None:
    harness, workers = on_private_broker
    key = harness.create_app("greeting")["api_key"]
    run_id = start_async(harness, key)["workflow_run_id"]  # no worker yet: the message waits in Redis
    assert row(harness, run_id).queued_at is not None, "the broker accepted it"
    broker_server.restart()  # killed, back empty: the message is gone
    workers.start()
    assert_once(wait_ended(harness, run_id, "succeeded"))
    assert workers.attempts_started(run_id) == 1


def test_a_moved_broker_folder_loses_no_action(make_harness: Callable[..., AppHarness]) -> None:
    harness = make_harness(start_worker=False, **FAST, CELERY_BROKER_URL="filesystem://")
    workers = Workers(harness)
    try:
        key = harness.create_app("greeting")["api_key"]
        workers.start()
        before = start_async(harness, key)["workflow_run_id"]
        assert_once(wait_ended(harness, before, "succeeded"))
        folder = pathlib.Path(harness.env["VAR_DIR"]) / "broker"
        workers.started[0].kill()
        queued = start_async(harness, key, "Queued")["workflow_run_id"]  # its message is in the folder
        shutil.move(folder, folder.with_name("broker-moved"))  # an operator moves it away, message and all
        worker = workers.start()
        after = start_async(harness, key, "After")["workflow_run_id"]
        for run_id in (queued, after):
            assert_once(wait_ended(harness, run_id, "succeeded"))
            assert workers.attempts_started(run_id) == 1
        folder.rename(folder.with_name("broker-moved-again"))  # and again, under a live worker
        again = start_async(harness, key, "Again")["workflow_run_id"]
        assert_once(wait_ended(harness, again, "succeeded"))
        assert worker.process.poll() is None, "the worker lived through it"
    finally:
        workers.stop_all()
