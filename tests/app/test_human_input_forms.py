"""Human-input forms by token (Dify's ``/form/human_input/<form_token>``): read, answer, expire, refuse.

Every answer is checked against a real worker: a submitted form resumes its run, an expired one
resumes it with the timeout, and every refusal (404, 412, 400) leaves the run exactly as it was.
"""

from __future__ import annotations

import concurrent.futures
import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import update

from api.models import HumanInputForm, TaskOutbox, WorkflowRun
from api.models.engine import db
from api.services import human_input_service
from api.services.task_queue import dispatch_due
from harness.app_database import APP_DATABASES
from harness.processes import free_port
from harness.waiting import wait_until
from tests.app import examples
from tests.app.conftest import AppHarness
from tests.app.test_service_api import wait_for_status

pytestmark = pytest.mark.parametrize("app_database", APP_DATABASES, indirect=True, scope="module")

GREETING = examples.greeting()


def with_form(**changes: Any) -> dict[str, Any]:
    """The greeting app whose human-input node has ``changes`` (actions, a timeout)."""
    definition = copy.deepcopy(GREETING)
    renamed = {"actions": "user_actions"}
    data = examples.node_data(definition, "approve")
    data.update({renamed.get(key, key): value for key, value in changes.items()})
    if "timeout" in changes:
        data["timeout_unit"] = "second"
    return definition


@pytest.fixture(scope="module")
def greeting(harness: AppHarness) -> dict[str, str]:
    return harness.create_app("greeting")


def pause(harness: AppHarness, key: str, user: str = "u1") -> dict[str, Any]:
    """A run paused at its form: the blocking response (with ``paused_nodes`` and ``reasons``)."""
    body = {"inputs": {"name": "Ada", "mood": "formal"}, "user": user, "response_mode": "blocking"}
    paused: dict[str, Any] = harness.post("/v1/workflows/run", key, body).json
    assert paused["data"]["status"] == "paused", paused
    return paused


def form_path(token: str) -> str:
    return f"/v1/form/human_input/{token}"


def test_a_form_is_read_and_answered_by_its_token(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    paused = pause(harness, key)
    data = paused["data"]
    assert data["paused_nodes"] == ["approve"] and data["finished_at"] is None
    (reason,) = data["reasons"]
    assert reason["TYPE"] == "human_input_required" and reason["node_id"] == "approve"
    assert reason["approval_channels"] == [] and "type" not in reason
    token = reason["form_token"]

    shown = harness.get(form_path(token), key)
    assert shown.status_code == 200
    assert set(shown.json) == {"form_content", "inputs", "resolved_default_values", "user_actions", "expiration_time"}
    assert (
        shown.json["user_actions"] == reason["actions"] and shown.json["expiration_time"] == reason["expiration_time"]
    )
    assert [field["output_variable_name"] for field in shown.json["inputs"]] == ["approved", "note"]

    answered = harness.post(form_path(token), key, {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"})
    assert answered.status_code == 200 and answered.json == {}
    detail = wait_for_status(harness, key, paused["workflow_run_id"], "u1", {"succeeded"})
    assert detail["outputs"]["greeting"].endswith("(approved: true)") and detail["total_tokens"] > 0

    again = harness.post(form_path(token), key, {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"})
    assert again.status_code == 412 and again.json["code"] == "human_input_form_submitted"
    assert harness.get(form_path(token), key).json["code"] == "human_input_form_submitted"
    events = harness.events(paused["workflow_run_id"])
    filled = [e["data"] for e in events if e["event"] == "human_input_form_filled"]
    assert len(filled) == 1 and filled[0]["action_id"] == "submit"


def test_refusals_leave_the_form_open(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    paused = pause(harness, key, user="owner")
    token = paused["data"]["reasons"][0]["form_token"]
    other_app = harness.create_app("greeting")["api_key"]
    good = {"inputs": {"approved": "false"}, "action": "submit", "user": "owner"}

    refused: list[tuple[str, Any, Any, int, str]] = [
        ("unknown token", form_path("nope"), good, 404, "not_found"),
        ("hostile token", form_path("x" * 300), good, 404, "not_found"),
        ("token with a NUL", form_path("abc%00def"), good, 404, "not_found"),
        ("a wrong type", form_path(token), {**good, "inputs": {"approved": "yes"}}, 400, "invalid_form_data"),
        ("a missing field", form_path(token), {**good, "inputs": {}}, 400, "invalid_form_data"),
        ("an unknown action", form_path(token), {**good, "action": "launch"}, 400, "invalid_form_data"),
        ("inputs not an object", form_path(token), {**good, "inputs": [1]}, 400, "invalid_form_data"),
        ("no user", form_path(token), {"inputs": {"approved": "true"}, "action": "submit"}, 400, "invalid_param"),
        ("a body that is a list", form_path(token), [], 400, "invalid_param"),
    ]
    for what, path, body, status, code in refused:
        answer = harness.post(path, key, body)
        assert (answer.status_code, answer.json["code"]) == (status, code), what
    foreign = harness.get(form_path(token), other_app)
    assert foreign.status_code == 404 and foreign.json["code"] == "not_found", "another app's key sees no form"
    assert harness.get(form_path(token), key).status_code == 200, "the form is still open"
    detail = harness.get(f"/v1/workflows/run/{paused['workflow_run_id']}?user=owner", key).json
    assert detail["status"] == "paused"
    # The action may be left out: the form's first one is taken.
    assert harness.post(form_path(token), key, {"inputs": {"approved": "false"}, "user": "owner"}).status_code == 200
    wait_for_status(harness, key, paused["workflow_run_id"], "owner", {"succeeded"})


def test_any_end_user_of_the_app_answers_and_the_first_answer_wins(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    paused = pause(harness, key, user="owner")
    token = paused["data"]["reasons"][0]["form_token"]
    answer = {"inputs": {"approved": "true", "note": "seen"}, "action": "submit", "user": "a reviewer"}
    assert harness.post(form_path(token), key, answer).status_code == 200
    late = harness.post(form_path(token), key, {**answer, "user": "owner"})
    assert (late.status_code, late.json["code"]) == (412, "human_input_form_submitted")
    wait_for_status(harness, key, paused["workflow_run_id"], "owner", {"succeeded"})
    filled = next(
        e["data"] for e in harness.events(paused["workflow_run_id"]) if e["event"] == "human_input_form_filled"
    )
    assert filled["submitted_data"] == {"approved": "true", "note": "seen"}


def test_two_answers_at_once_resume_the_run_once(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    paused = pause(harness, key)
    token = paused["data"]["reasons"][0]["form_token"]
    body = {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"}

    def answer(_: int) -> tuple[int, str | None]:
        with harness.app.test_client() as client:
            response = client.post(form_path(token), json=body, headers={"Authorization": f"Bearer {key}"})
            return response.status_code, (response.json or {}).get("code")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = sorted(pool.map(answer, range(4)), key=lambda pair: pair[0])
    assert answers[0] == (200, None) and all(a == (412, "human_input_form_submitted") for a in answers[1:]), answers
    wait_for_status(harness, key, paused["workflow_run_id"], "u1", {"succeeded"})
    wait_until(lambda: harness.topic_info(paused["workflow_run_id"]).sealed, 10, "the resumed run's end")
    names = [e["event"] for e in harness.events(paused["workflow_run_id"])]
    assert names.count("human_input_form_filled") == 1 and names.count("workflow_finished") == 1


def test_a_stopped_runs_form_is_expired(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    paused = pause(harness, key)
    token = paused["data"]["reasons"][0]["form_token"]
    assert harness.post(f"/v1/workflows/tasks/{paused['task_id']}/stop", key, {"user": "u1"}).status_code == 200
    late = harness.post(form_path(token), key, {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"})
    assert late.status_code == 412 and late.json["code"] == "human_input_form_expired"


def test_an_answer_while_the_queue_is_down_is_kept_and_resumes_the_run_once(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    paused = pause(harness, key)
    token = paused["data"]["reasons"][0]["form_token"]
    # Another API process on the same data whose broker is gone: the answer is recorded with its task
    # message (the outbox) all the same, and the first sweep that reaches a broker sends it.
    cut_off = AppHarness({**harness.env, "CELERY_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}, None)
    try:
        answer = cut_off.post(form_path(token), key, {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"})
        assert answer.status_code == 200, answer.json
    finally:
        cut_off.close()
    again = harness.post(form_path(token), key, {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"})
    assert (again.status_code, again.json["code"]) == (412, "human_input_form_submitted")
    assert harness.get(f"/v1/workflows/run/{paused['workflow_run_id']}?user=u1", key).json["status"] == "running"
    with harness.app.app_context():  # a sweep of a process whose broker answers, once the grace is over
        db.session.execute(update(TaskOutbox).values(due_at=0))
        db.session.commit()
        dispatch_due()  # (unless the worker's own reaper got there first)
        db.session.remove()
    wait_for_status(harness, key, paused["workflow_run_id"], "u1", {"succeeded"})
    wait_until(lambda: harness.topic_info(paused["workflow_run_id"]).sealed, 10, "the resumed run's end")
    names = [e["event"] for e in harness.events(paused["workflow_run_id"])]
    assert names.count("human_input_form_filled") == 1 and names.count("workflow_finished") == 1, names


def test_actions_of_the_node_are_the_buttons(harness: AppHarness) -> None:
    actions = [{"id": "approve", "title": "YES", "button_style": "primary"}, {"id": "reject", "title": "NO"}]
    key = harness.create_app(with_form(actions=actions))["api_key"]
    paused = pause(harness, key)
    token = paused["data"]["reasons"][0]["form_token"]
    shown = harness.get(form_path(token), key).json
    assert [a["id"] for a in shown["user_actions"]] == ["approve", "reject"]
    assert shown["user_actions"][1]["button_style"] == "default"
    answer = harness.post(form_path(token), key, {"inputs": {"approved": "false"}, "action": "reject", "user": "u1"})
    assert answer.status_code == 200
    wait_for_status(harness, key, paused["workflow_run_id"], "u1", {"succeeded"})
    filled = next(
        e["data"] for e in harness.events(paused["workflow_run_id"]) if e["event"] == "human_input_form_filled"
    )
    assert (filled["action_id"], filled["action_text"]) == ("reject", "NO")


def test_the_web_app_answers_forms_of_its_own_end_user(harness: AppHarness) -> None:
    created = harness.create_app("greeting")
    passport = harness.client.get("/api/passport", headers={"X-App-Code": created["site_code"]}).json
    auth = {"Authorization": f"Bearer {passport['access_token']}"}
    started = harness.client.post(
        "/api/workflows/run",
        json={"inputs": {"name": "Web", "mood": "formal"}, "response_mode": "blocking"},
        headers=auth,
    ).json
    token = started["data"]["reasons"][0]["form_token"]
    other = harness.client.get("/api/passport", headers={"X-App-Code": created["site_code"]}).json
    foreign = {"Authorization": f"Bearer {other['access_token']}"}
    assert harness.client.get(f"/api/form/human_input/{token}", headers=foreign).status_code == 404
    assert harness.client.get(f"/api/form/human_input/{token}", headers=auth).status_code == 200
    body = {"inputs": {"approved": "true"}, "action": "submit"}
    assert harness.client.post(f"/api/form/human_input/{token}", json=body, headers=foreign).status_code == 404
    answered = harness.client.post(f"/api/form/human_input/{token}", json=body, headers=auth)
    assert answered.status_code == 200 and answered.json == {}


def test_an_unanswered_form_expires_and_its_run_fails_with_the_timeout(
    make_harness: Callable[..., AppHarness],
) -> None:
    # The worker's reaper sweeps often here; nobody reads the form or the run.
    harness = make_harness(WORKFLOW_REAPER_INTERVAL=0.5)
    key = harness.create_app(with_form(timeout=1))["api_key"]
    paused = pause(harness, key)
    run_id = paused["workflow_run_id"]
    expiration = paused["data"]["reasons"][0]["expiration_time"]
    assert expiration <= time.time() + 2
    detail = wait_for_status(harness, key, run_id, "u1", {"failed"}, timeout=20)
    assert detail["error"] == "the human input form expired"
    wait_until(lambda: harness.topic_info(run_id).sealed, 10, "the expired run's end")
    events = harness.events(run_id)
    names = [e["event"] for e in events]
    assert names[-3:] == ["human_input_form_timeout", "node_finished", "workflow_finished"]
    assert events[-3]["data"]["expiration_time"] == expiration
    token = paused["data"]["reasons"][0]["form_token"]
    late = harness.post(form_path(token), key, {"inputs": {"approved": "true"}, "action": "submit", "user": "u1"})
    assert late.status_code == 412 and late.json["code"] == "human_input_form_expired"


def test_a_form_due_before_its_pause_is_recorded_still_resumes_the_run(
    make_harness: Callable[..., AppHarness],
) -> None:
    """The attempt opens its form, then records the pause. A sweep in between (a loaded machine, a short
    timeout) leaves the form to a later sweep, which resumes the run with the timeout: ending the form
    alone would leave the run paused with nothing to resume it."""
    harness = make_harness(WORKFLOW_REAPER_INTERVAL=0)  # the test sweeps itself
    key = harness.create_app(with_form(timeout=3600))["api_key"]
    paused = pause(harness, key)
    run_id, form_id = paused["workflow_run_id"], paused["data"]["reasons"][0]["form_id"]
    with harness.app.app_context():
        # That moment: the form open and due, its run still running (the pause not recorded yet).
        db.session.execute(update(WorkflowRun).where(WorkflowRun.id == run_id).values(status="running"))
        db.session.execute(update(HumanInputForm).where(HumanInputForm.id == form_id).values(expires_at=time.time()))
        db.session.commit()
        assert human_input_service.expire_overdue() == 0
        form = db.session.get(HumanInputForm, form_id)
        assert form is not None and form.status == "waiting"
        db.session.execute(update(WorkflowRun).where(WorkflowRun.id == run_id).values(status="paused"))
        db.session.commit()
        assert human_input_service.expire_overdue() == 1
        db.session.remove()
    detail = wait_for_status(harness, key, run_id, "u1", {"failed"}, timeout=20)
    assert detail["error"] == "the human input form expired"


def test_a_reader_expires_a_form_when_no_reaper_does(make_harness: Callable[..., AppHarness]) -> None:
    harness = make_harness(WORKFLOW_REAPER_INTERVAL=0)
    key = harness.create_app(with_form(timeout=1))["api_key"]
    paused = pause(harness, key)
    token = paused["data"]["reasons"][0]["form_token"]
    deadline = paused["data"]["reasons"][0]["expiration_time"] + 0.5
    wait_until(lambda: time.time() >= deadline, 10, "the form's expiration time")
    shown = harness.get(form_path(token), key)
    assert shown.status_code == 412 and shown.json["code"] == "human_input_form_expired"
    wait_for_status(harness, key, paused["workflow_run_id"], "u1", {"failed"}, timeout=20)
    with harness.app.app_context():
        form = db.session.get(HumanInputForm, paused["data"]["reasons"][0]["form_id"])
        assert form is not None and form.status == "expired"
        db.session.remove()


def test_the_old_route_answers_the_open_form(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    paused = pause(harness, key)
    run_id = paused["workflow_run_id"]
    ok = harness.post(f"/v1/workflows/runs/{run_id}/human-input", key, {"user": "u1", "inputs": {"approved": "true"}})
    assert ok.status_code == 200 and ok.json["task_id"] == paused["task_id"]
    wait_for_status(harness, key, run_id, "u1", {"succeeded"})
    token = paused["data"]["reasons"][0]["form_token"]
    late = harness.post(form_path(token), key, {"inputs": {"approved": "true"}, "user": "u1"})
    assert late.status_code == 412 and late.json["code"] == "human_input_form_submitted"


def test_only_the_forms_own_fields_travel_and_text_has_a_cap(harness: AppHarness, greeting: dict[str, str]) -> None:
    from api.core.workflow.forms import MAX_FIELD_TEXT

    key = greeting["api_key"]
    paused = pause(harness, key)
    token = paused["data"]["reasons"][0]["form_token"]
    too_long = {"inputs": {"approved": "true", "note": "x" * (MAX_FIELD_TEXT + 1)}, "action": "submit", "user": "u1"}
    refused = harness.post(form_path(token), key, too_long)
    assert (refused.status_code, refused.json["code"]) == (400, "invalid_form_data"), refused.json
    smuggled = {"approved": "true", "note": "x" * MAX_FIELD_TEXT, "undeclared": "y" * 10_000}
    answered = harness.post(form_path(token), key, {"inputs": smuggled, "action": "submit", "user": "u1"})
    assert answered.status_code == 200, answered.json
    with harness.app.app_context():
        run = db.session.get(WorkflowRun, paused["workflow_run_id"])
        assert run is not None and run.resume_json is not None
        resumed_with = json.loads(run.resume_json)  # what the task message carried
        db.session.remove()
    assert set(resumed_with["inputs"]) == {"approved", "note"}
    wait_for_status(harness, key, paused["workflow_run_id"], "u1", {"succeeded"})
    filled = next(
        e["data"] for e in harness.events(paused["workflow_run_id"]) if e["event"] == "human_input_form_filled"
    )
    assert "undeclared" not in filled["submitted_data"]
