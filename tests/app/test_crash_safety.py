"""No user action is lost whatever process dies: a run's start, a form's answer and a stop each take
effect exactly once when the worker is killed at every step of their way — before the broker accepted
the message, after it did, after a worker fetched it, after a worker claimed its attempt, and after the
attempt ended — on the Redis broker and on the embedded profile's filesystem broker.

A killed worker is SIGKILLed (nothing of it runs after) and a new one is started; "exactly once" is
judged from the run's stored events (one start, one answer taken, one end) and from the workers' logs
(how many attempts any of them claimed).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from api.core.app.apps import run_store
from api.core.app.apps.task_outbox import Message
from api.models import App
from api.models.engine import db
from api.services import task_queue
from api.services import workflow_run_service as runs
from harness.processes import free_port
from harness.waiting import wait_until
from tests.app import examples
from tests.app.conftest import AppHarness
from tests.app.crash_steps import BROKERS, BUSY_RUN, FAST, Workers, assert_once, outbox_size, row, wait_ended
from tests.app.test_service_api import slow_greeting

pytestmark = pytest.mark.slow  # handed out first by make test (tests/conftest.py)

GREETING = examples.greeting()
STEPS = ("before_broker", "in_broker", "fetched", "claimed", "ended")
FORM_ANSWER = {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"}


def slow_after_the_form(tokens: int = 4000, delay: float = 0.05) -> dict[str, Any]:
    """The greeting with approval whose resumed part streams for a long while (a worker to kill mid-way)."""
    definition = copy.deepcopy(GREETING)
    slow = copy.deepcopy(examples.node_data(definition, "formal_draft"))
    slow.update(title="Afterthought")
    graph = examples.graph_of(definition)
    graph["nodes"].append({"id": "slow", "data": slow})
    graph["edges"] = [edge for edge in graph["edges"] if edge["source"] != "approve"]
    graph["edges"] += [
        {"id": "approve-slow", "source": "approve", "target": "slow", "sourceHandle": "source"},
        {"id": "slow-final", "source": "slow", "target": "final", "sourceHandle": "source"},
    ]
    definition = examples.script_model(
        definition, "slow", response=" ".join(f"w{i}" for i in range(tokens)), token_delay=delay
    )
    return definition


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def setup(make_harness: Callable[..., AppHarness], broker: str) -> Iterator[tuple[AppHarness, Workers]]:
    harness = make_harness(start_worker=False, **FAST, **BROKERS[broker])
    workers = Workers(harness)
    try:
        yield harness, workers
    finally:
        workers.stop_all()


def post(harness: AppHarness, key: str, path: str, body: Any, expected: int = 200) -> dict[str, Any]:
    response = harness.post(path, key, body)
    assert response.status_code == expected, response.json
    answer: dict[str, Any] = response.json
    return answer


def start_async(harness: AppHarness, key: str, name: str = "Ada", mood: str = "cheerful") -> dict[str, Any]:
    body = {"inputs": {"name": name, "mood": mood}, "user": "u1", "response_mode": "async"}
    return post(harness, key, "/v1/workflows/run", body, expected=202)


def keep_busy(harness: AppHarness, workers: Workers) -> str:
    """Start a run that keeps a one-thread worker's only thread busy; return its id once it has started."""
    key = harness.create_app(slow_greeting(**BUSY_RUN))["api_key"]
    run_id: str = start_async(harness, key, "Busy")["workflow_run_id"]
    wait_until(lambda: workers.attempts_started(run_id), 30, "the busy run to start")
    return run_id


def send_again(harness: AppHarness, run_id: str, resume: dict[str, Any] | None) -> None:
    """What a broker does with a message whose worker died before acknowledging it: deliver it again."""
    with harness.app.app_context():
        run = row(harness, run_id)
        assert run.attempt_id is not None
        task_queue.send(Message(run.id, run.task_id, run.attempt_id, resume))
        db.session.remove()


def cut_off_api(harness: AppHarness) -> AppHarness:
    """Another API process on the same data whose broker does not answer."""
    return AppHarness({**harness.env, "CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}, None)


@pytest.mark.parametrize("step", STEPS)
def test_a_start_takes_effect_once(setup: tuple[AppHarness, Workers], step: str) -> None:
    harness, workers = setup
    key = harness.create_app(slow_greeting(tokens=3000) if step == "claimed" else "greeting")["api_key"]
    first = None if step in ("before_broker", "in_broker") else workers.start()
    busy = keep_busy(harness, workers) if step == "fetched" else None
    if step == "before_broker":
        cut_off = cut_off_api(harness)
        try:  # accepted and recorded, but its message never reached a broker
            run_id = start_async(cut_off, key)["workflow_run_id"]
        finally:
            cut_off.close()
        assert row(harness, run_id).queued_at is None
    else:
        run_id = start_async(harness, key)["workflow_run_id"]
    task_id = row(harness, run_id).task_id
    if step == "fetched":
        assert first is not None
        wait_until(lambda: workers.received(task_id), 20, "the worker to fetch the message")
        assert not workers.attempts_started(run_id), "fetched, not claimed: the worker's thread is busy"
        first.kill()
    elif step == "claimed":
        assert first is not None
        wait_until(lambda: workers.attempts_started(run_id), 20, "a worker to claim the attempt")
        first.kill()
    elif step == "ended":
        wait_ended(harness, run_id, "succeeded")
        send_again(harness, run_id, None)
    workers.start(concurrency=2)
    if step == "claimed":  # the attempt died with its worker: the run fails, and is never run twice
        assert_once(wait_ended(harness, run_id, "failed"))
    else:
        assert_once(wait_ended(harness, run_id, "succeeded"))
    if step == "ended":  # the second delivery was fetched and ran nothing
        wait_until(lambda: workers.received(task_id) >= 2, 20, "the second delivery")
    assert workers.attempts_started(run_id) == 1
    if busy is not None:
        wait_ended(harness, busy, "failed")  # (its worker was killed mid-run)
    wait_until(lambda: outbox_size(harness) == 0, 10, "the outbox to empty")


def pause_run(harness: AppHarness, key: str) -> tuple[str, str]:
    """A run paused at its form (by a worker that is then gone or busy): its id and its form's token."""
    body = {"inputs": {"name": "Ada", "mood": "formal"}, "user": "u1", "response_mode": "blocking"}
    paused = post(harness, key, "/v1/workflows/run", body)
    assert paused["data"]["status"] == "paused", paused
    return paused["workflow_run_id"], paused["data"]["reasons"][0]["form_token"]


@pytest.mark.parametrize("step", STEPS)
def test_a_form_answer_takes_effect_once(setup: tuple[AppHarness, Workers], step: str) -> None:
    harness, workers = setup
    key = harness.create_app(slow_after_the_form(tokens=3000) if step == "claimed" else "greeting")["api_key"]
    first = workers.start()
    run_id, token = pause_run(harness, key)
    busy = keep_busy(harness, workers) if step == "fetched" else None
    if step in ("before_broker", "in_broker"):
        first.kill()  # no worker is alive when the answer comes
    form = f"/v1/form/human_input/{token}"
    if step == "before_broker":
        cut_off = cut_off_api(harness)
        try:
            post(cut_off, key, form, FORM_ANSWER)
        finally:
            cut_off.close()
    else:
        post(harness, key, form, FORM_ANSWER)
    assert harness.post(form, key, FORM_ANSWER).status_code == 412, "the answer is taken, once"
    assert row(harness, run_id).status != "paused"
    task_id = row(harness, run_id).task_id
    if step == "fetched":
        wait_until(lambda: workers.received(task_id) >= 2, 20, "the worker to fetch the resume message")
        assert not workers.attempts_started(run_id, resumed=True)
        first.kill()
    elif step == "claimed":
        wait_until(lambda: workers.attempts_started(run_id, resumed=True), 20, "a worker to claim the resume")
        first.kill()
    elif step == "ended":
        wait_ended(harness, run_id, "succeeded")
        send_again(harness, run_id, {"kind": "submission", "inputs": FORM_ANSWER["inputs"], "action": "submit"})
    workers.start(concurrency=2)
    died = step == "claimed"  # the resumed attempt died with its worker: the run fails, never resumes twice
    assert_once(wait_ended(harness, run_id, "failed" if died else "succeeded"), resumed=True, died=died)
    if step == "ended":
        wait_until(lambda: workers.received(task_id) >= 3, 20, "the second delivery of the resume")
    assert workers.attempts_started(run_id, resumed=True) == 1
    if busy is not None:
        wait_ended(harness, busy, "failed")
    wait_until(lambda: outbox_size(harness) == 0, 10, "the outbox to empty")


@pytest.mark.parametrize("step", ("in_broker", "fetched", "paused"))
def test_a_stop_takes_effect_once(setup: tuple[AppHarness, Workers], step: str) -> None:
    """A stop of a run no worker executes ends it at once, in the stop's own transaction; the message a
    broker or a dead worker still holds runs nothing when it is delivered (or sent again)."""
    harness, workers = setup
    key = harness.create_app("greeting")["api_key"]
    first = workers.start()
    if step == "paused":
        run_id, token = pause_run(harness, key)
    elif step == "fetched":
        keep_busy(harness, workers)
        run_id = start_async(harness, key)["workflow_run_id"]
        wait_until(lambda: workers.received(row(harness, run_id).task_id), 20, "the worker to fetch the message")
    else:
        first.kill()
        run_id = start_async(harness, key)["workflow_run_id"]
    task_id = row(harness, run_id).task_id
    post(harness, key, f"/v1/workflows/tasks/{task_id}/stop", {"user": "u1"})
    assert row(harness, run_id).status == "stopped", "ended by the stop itself: no worker executed it"
    assert outbox_size(harness) == 0, "its message is forgotten with it"
    first.kill()
    workers.start(concurrency=2)
    if step == "in_broker":  # the message still in the broker is delivered, and runs nothing
        wait_until(lambda: workers.received(task_id), 20, "the stopped run's message to be delivered")
    names = wait_ended(harness, run_id, "stopped")
    assert names.count("workflow_finished") == 1 and names[-1] == "workflow_finished", names
    assert workers.attempts_started(run_id) == (1 if step == "paused" else 0)
    if step == "paused":
        again = harness.post(f"/v1/form/human_input/{token}", key, FORM_ANSWER)
        assert again.status_code == 412, "a stopped run's form cannot resume it"


def test_an_api_that_dies_after_committing_a_stop_leaves_it_whole(setup: tuple[AppHarness, Workers]) -> None:
    """The stop's flag, the paused run's end and its forms' closing are one transaction: there is no moment
    at which the flag is recorded and the run still paused (a later answer would have resumed it)."""
    harness, workers = setup
    key = harness.create_app("greeting")["api_key"]
    workers.start()
    run_id, token = pause_run(harness, key)
    with harness.app.app_context():
        app = db.session.query(App).filter(App.api_key == key).one()
        run = runs.get_run(app, run_id, "u1")
        # The service's stop, up to its transaction's commit; the repair of the topic's end (what a process
        # dying right after would not do) is left to the reaper.
        assert run_store.stop(run.id, "stopped by user", run.total_steps) == "paused"
        db.session.remove()
    assert harness.post(f"/v1/form/human_input/{token}", key, FORM_ANSWER).status_code == 412
    names = wait_ended(harness, run_id, "stopped")  # the worker's reaper writes the pending end
    assert names.count("workflow_finished") == 1, names
