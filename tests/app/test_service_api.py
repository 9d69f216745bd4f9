"""The service API end to end: Flask in-process, a real Celery worker process, Redis as broker, on
both app databases."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from api.models import App
from api.models.engine import db
from harness.app_database import APP_DATABASES
from harness.waiting import wait_until
from tests.app import examples
from tests.app.conftest import AppHarness

# Every test once on SQLite and once on PostgreSQL (a private schema): the API answers the same on both.
pytestmark = pytest.mark.parametrize("app_database", APP_DATABASES, indirect=True, scope="module")

GREETING = examples.greeting()


def slow_greeting(delay: float = 0.05, tokens: int = 200) -> dict[str, Any]:
    definition = copy.deepcopy(GREETING)
    definition["name"] = "Slow greeting"
    definition = examples.script_model(definition, response=" ".join(f"word{i}" for i in range(tokens)))
    definition = examples.script_model(definition, token_delay=delay)
    return definition


def wait_for_status(
    harness: AppHarness, key: str, run_id: str, user: str, statuses: set[str], timeout: float = 30
) -> dict[str, Any]:
    def detail_in_status() -> dict[str, Any] | None:
        response = harness.get(f"/v1/workflows/run/{run_id}?user={user}", key)
        assert response.status_code == 200, response.json
        return dict(response.json) if response.json["status"] in statuses else None

    return wait_until(detail_in_status, timeout, f"run {run_id} to be {' or '.join(sorted(statuses))}")


def wait_for_events(
    harness: AppHarness, run_id: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 30
) -> list[dict[str, Any]]:
    def matching_events() -> list[dict[str, Any]] | None:
        events = harness.events(run_id)
        return events if predicate(events) else None

    return wait_until(matching_events, timeout, f"the events of run {run_id} to match")


@pytest.fixture(scope="module")
def greeting(harness: AppHarness) -> dict[str, str]:
    return harness.create_app("greeting")


def test_create_app_command_prints_the_api_key(harness: AppHarness) -> None:
    created = harness.create_app("greeting")
    assert created["api_key"].startswith("app-") and created["name"] == "Greeting with approval"


def test_create_app_refuses_an_invalid_workflow(harness: AppHarness, tmp_path: Any) -> None:
    broken = copy.deepcopy(GREETING)
    examples.graph_of(broken)["nodes"].append({"id": "sandboxed", "data": {"type": "code", "title": "Code"}})
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken))
    result = harness.app.test_cli_runner().invoke(args=["create-app", "--file", str(path)])
    assert result.exit_code != 0 and "invalid workflow" in result.output


def test_blocking_run_returns_the_final_outputs(harness: AppHarness, greeting: dict[str, str]) -> None:
    response = harness.post(
        "/v1/workflows/run", greeting["api_key"], {"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "blocking"}
    )
    assert response.status_code == 200, response.json
    body = response.json
    assert body["data"]["status"] == "succeeded"
    assert body["data"]["outputs"] == {
        "greeting": "Hello Ada! It is a wonderful day to build durable streams together."
    }
    events = harness.events(body["workflow_run_id"])
    assert events[0]["event"] == "workflow_started" and events[-1]["event"] == "workflow_finished"
    assert {e["task_id"] for e in events} == {body["task_id"]}
    # The worker appends the end, then seals: a blocking answer may come between the two.
    info = wait_until(lambda: harness.sealed(body["workflow_run_id"]), 10, "the run's topic to be sealed")
    assert info.length == len(events)


def test_async_run_returns_ids_at_once_and_finishes_in_the_background(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    response = harness.post(
        "/v1/workflows/run", greeting["api_key"], {"inputs": {"name": "Bo"}, "user": "u1", "response_mode": "async"}
    )
    assert response.status_code == 202
    run_id, task_id = response.json["workflow_run_id"], response.json["task_id"]
    assert run_id != task_id
    detail = wait_for_status(harness, greeting["api_key"], run_id, "u1", {"succeeded"})
    assert detail["outputs"]["greeting"].startswith("Hello Bo!") and detail["finished_at"] is not None
    assert json.loads(detail["inputs"]) == {"name": "Bo"} and detail["total_steps"] == 4


def test_authentication_errors(harness: AppHarness) -> None:
    body = {"inputs": {"name": "x"}, "user": "u1"}
    missing = harness.client.post("/v1/workflows/run", json=body)
    assert missing.status_code == 401 and missing.json["code"] == "unauthorized" and missing.json["status"] == 401
    wrong = harness.post("/v1/workflows/run", "app-not-a-key", body)
    assert wrong.status_code == 401 and set(wrong.json) == {"code", "message", "status"}
    basic = harness.client.post("/v1/workflows/run", json=body, headers={"Authorization": "Basic abc"})
    assert basic.status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"inputs": {"name": "x"}},
        {"inputs": "x", "user": "u"},
        {"inputs": {}, "user": "u"},
        {"inputs": {"name": "x"}, "user": "u", "response_mode": "carrier-pigeon"},
    ],
)
def test_malformed_requests_are_400(harness: AppHarness, greeting: dict[str, str], body: Any) -> None:
    if body is None:
        response = harness.client.post(
            "/v1/workflows/run",
            data="{not json",
            headers={"Authorization": f"Bearer {greeting['api_key']}", "Content-Type": "application/json"},
        )
    else:
        response = harness.post("/v1/workflows/run", greeting["api_key"], body)
    assert response.status_code == 400 and response.json["code"] == "invalid_param"


def test_runs_of_other_apps_and_other_users_are_404(harness: AppHarness, greeting: dict[str, str]) -> None:
    other_app = harness.create_app("greeting")
    run = harness.post("/v1/workflows/run", greeting["api_key"], {"inputs": {"name": "Cy"}, "user": "owner"}).json
    run_id, task_id = run["workflow_run_id"], run["task_id"]
    assert harness.get(f"/v1/workflows/run/{run_id}?user=owner", greeting["api_key"]).status_code == 200
    for key, user in ((other_app["api_key"], "owner"), (greeting["api_key"], "intruder")):
        response = harness.get(f"/v1/workflows/run/{run_id}?user={user}", key)
        assert response.status_code == 404 and response.json["code"] == "not_found"
        # Dify's stop applies to the task regardless of `user`, and an unknown task is a success too.
        stop = harness.post(f"/v1/workflows/tasks/{task_id}/stop", key, {"user": user})
        assert (stop.status_code, stop.json) == (200, {"result": "success"})
        resume = harness.post(f"/v1/workflows/runs/{run_id}/human-input", key, {"user": user, "inputs": {}})
        assert resume.status_code == 404
    # Without ?user= the key's app sees every run of its own, as Dify documents the route; another app's is 404.
    assert harness.get(f"/v1/workflows/run/{run_id}", greeting["api_key"]).json["id"] == run_id
    assert harness.get(f"/v1/workflows/run/{run_id}", other_app["api_key"]).status_code == 404
    assert harness.get(f"/v1/workflows/run/{run_id}?user=", greeting["api_key"]).status_code == 400
    assert harness.get("/v1/workflows/run/nope?user=owner", greeting["api_key"]).status_code == 404


def test_stop_a_running_run(harness: AppHarness) -> None:
    app = harness.create_app(slow_greeting())
    key = app["api_key"]
    run = harness.post(
        "/v1/workflows/run", key, {"inputs": {"name": "Di"}, "user": "u1", "response_mode": "async"}
    ).json
    wait_for_events(harness, run["workflow_run_id"], lambda es: any(e["event"] == "text_chunk" for e in es))
    stopped = harness.post(f"/v1/workflows/tasks/{run['task_id']}/stop", key, {"user": "u1"})
    assert stopped.status_code == 200 and stopped.json == {"result": "success"}
    detail = wait_for_status(harness, key, run["workflow_run_id"], "u1", {"stopped"}, timeout=15)
    assert detail["error"] == "stopped by user"
    # The row is written before the end is appended and the topic sealed: wait for the seal.
    wait_until(lambda: harness.sealed(run["workflow_run_id"]), 10, "the stopped run's topic to be sealed")
    events = harness.events(run["workflow_run_id"])
    assert events[-1]["event"] == "workflow_finished" and events[-1]["data"]["status"] == "stopped"
    again = harness.post(f"/v1/workflows/tasks/{run['task_id']}/stop", key, {"user": "u1"})
    assert again.status_code == 200  # idempotent


def test_pause_and_resume_with_human_input(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    paused = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Eve", "mood": "formal"}, "user": "u2"}).json
    assert paused["data"]["status"] == "paused"
    run_id = paused["workflow_run_id"]
    events = harness.events(run_id)
    assert [e["event"] for e in events][-2:] == ["human_input_required", "workflow_paused"]
    assert not harness.topic_info(run_id).sealed, "a pause must not seal the topic"

    bad = harness.post(f"/v1/workflows/runs/{run_id}/human-input", key, {"user": "u2", "inputs": {"approved": "yes"}})
    assert bad.status_code == 400
    ok = harness.post(f"/v1/workflows/runs/{run_id}/human-input", key, {"user": "u2", "inputs": {"approved": "true"}})
    assert ok.status_code == 200 and ok.json["task_id"] == paused["task_id"]
    detail = wait_for_status(harness, key, run_id, "u2", {"succeeded"})
    assert detail["outputs"]["greeting"].endswith("(approved: true)")
    wait_until(lambda: harness.sealed(run_id), 10, "the resumed run's topic to be sealed")
    events = harness.events(run_id)
    names = [e["event"] for e in events]
    # Dify's shape: the resumed attempt starts again, with its reason.
    started = [e["data"]["reason"] for e in events if e["event"] == "workflow_started"]
    assert started == ["initial", "resumption"] and names.count("workflow_paused") == 1
    assert names[-1] == "workflow_finished"
    late = harness.post(f"/v1/workflows/runs/{run_id}/human-input", key, {"user": "u2", "inputs": {"approved": "true"}})
    assert late.status_code == 409 and late.json["code"] == "workflow_not_paused"


def test_stopping_a_paused_run_ends_it_in_the_api(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    paused = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Fay", "mood": "formal"}, "user": "u3"}).json
    detail = harness.get(f"/v1/workflows/run/{paused['workflow_run_id']}", key).json
    # Dify's detail: the inputs as JSON text, the outputs an object even before the run has any.
    assert detail["status"] == "paused" and json.loads(detail["inputs"]) == {"name": "Fay", "mood": "formal"}
    assert detail["outputs"] == {}
    # Any end user of the app may stop its task, as Dify documents the route.
    stopped = harness.post(f"/v1/workflows/tasks/{paused['task_id']}/stop", key, {"user": "another end user"})
    assert (stopped.status_code, stopped.json) == (200, {"result": "success"})
    detail = wait_for_status(harness, key, paused["workflow_run_id"], "u3", {"stopped"}, timeout=5)
    assert detail["status"] == "stopped" and detail["outputs"] == {}
    events = harness.events(paused["workflow_run_id"])
    assert events[-1]["data"]["status"] == "stopped"
    # The end is appended, then the topic sealed: the row may say stopped between the two.
    wait_until(lambda: harness.sealed(paused["workflow_run_id"]), 10, "the stopped run's topic to be sealed")


def test_a_failing_node_fails_the_run_and_seals(harness: AppHarness) -> None:
    definition = copy.deepcopy(GREETING)
    definition = examples.script_model(definition, error_after_tokens=2, error="model overloaded")
    key = harness.create_app(definition)["api_key"]
    body = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Gus"}, "user": "u1"}).json
    assert body["data"]["status"] == "failed" and body["data"]["error"] == "model overloaded"
    events = harness.events(body["workflow_run_id"])
    assert events[-1]["data"]["status"] == "failed"
    # The answer comes with the end event; the seal that follows it may land a moment later.
    wait_until(lambda: harness.sealed(body["workflow_run_id"]), 10, "the failed run's topic to be sealed")


def test_watchdog_timeout_stops_the_run(make_harness: Callable[..., AppHarness]) -> None:
    max_execution_time = 1
    harness = make_harness(APP_MAX_EXECUTION_TIME=max_execution_time)
    key = harness.create_app(slow_greeting(delay=0.05, tokens=400))["api_key"]  # a 20 s answer
    started = time.monotonic()
    body = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Hal"}, "user": "u1"}).json
    assert time.monotonic() - started < 10 * max_execution_time, "stopped by the watchdog, not the model's end"
    assert body["data"]["status"] == "stopped" and "timed out" in body["data"]["error"]
    events = harness.events(body["workflow_run_id"])
    assert events[-1]["data"]["status"] == "stopped"
    # The worker seals the topic right after its last event, which the blocking answer may beat.
    wait_until(lambda: harness.sealed(body["workflow_run_id"]), 10, "the stopped run's topic to be sealed")


def test_a_killed_worker_is_caught_by_the_lease(make_harness: Callable[..., AppHarness]) -> None:
    from api.models import App, WorkflowRun
    from api.models.engine import db
    from api.services import run_recovery

    ttl = 3.0
    harness = make_harness(WORKFLOW_LEASE_TTL=ttl)
    key = harness.create_app(slow_greeting(delay=0.05, tokens=2000))["api_key"]
    run = harness.post(
        "/v1/workflows/run", key, {"inputs": {"name": "Ivy"}, "user": "u1", "response_mode": "async"}
    ).json
    run_id = run["workflow_run_id"]
    wait_for_events(harness, run_id, lambda es: any(e["event"] == "text_chunk" for e in es))
    assert harness.worker is not None
    harness.worker.kill()
    killed_at = time.monotonic()
    assert not harness.topic_info(run_id).sealed

    def lease_check_ends_the_run() -> bool:
        with harness.app.app_context():
            run_row = db.session.get(WorkflowRun, run_id)
            app_row = db.session.get(App, run_row.app_id)
            ended = run_recovery.check_lease(app_row, run_row)
            db.session.remove()
            return ended

    # The lease runs out at most one TTL after the kill: the check ends the run from then on.
    wait_until(lease_check_ends_the_run, 2 * ttl - (time.monotonic() - killed_at), "the expired lease", interval=0.1)
    events = harness.events(run_id)
    assert events[-1]["event"] == "workflow_finished" and events[-1]["data"]["status"] == "failed"
    assert "lease expired" in events[-1]["data"]["error"]
    assert harness.topic_info(run_id).sealed
    detail = wait_for_status(harness, key, run_id, "u1", {"failed"}, timeout=1)
    assert detail["error"].startswith("the worker executing this run stopped responding")
    with harness.app.app_context():  # a second check (another API process) changes nothing
        run_row = db.session.get(WorkflowRun, run_id)
        assert run_recovery.check_lease(db.session.get(App, run_row.app_id), run_row) is False


def test_an_engine_that_raises_ends_the_run_failed_and_sealed(harness: AppHarness) -> None:
    created = harness.create_app("greeting")
    key = created["api_key"]
    with harness.app.app_context():  # a graph graphon cannot build, as if the stored app were damaged
        app_row = db.session.get(App, created["app_id"])
        assert app_row is not None
        nodes = [{"id": "start", "data": {"type": "start"}}, {"id": "x", "data": {"type": "teleport"}}]
        edges = [{"id": "e", "source": "start", "target": "x", "sourceHandle": "source"}]
        app_row.graph_json = json.dumps({"nodes": nodes, "edges": edges})
        db.session.commit()
    body = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Max"}, "user": "u1"}).json
    # The error is for users: what happened, not the exception's text (that is in the worker's log).
    assert body["data"]["status"] == "failed" and body["data"]["error"] == "the run failed on an internal error"
    names = [e["event"] for e in harness.events(body["workflow_run_id"])]
    assert names.count("workflow_started") == 1 and names[-1] == "workflow_finished"
    assert harness.events(body["workflow_run_id"])[-1]["data"]["status"] == "failed"
    wait_until(lambda: harness.sealed(body["workflow_run_id"]), 10, "the failed run's topic to be sealed")


def test_a_listener_going_away_does_not_cancel_the_run(harness: AppHarness) -> None:
    from harness.sse import parse_sse

    key = harness.create_app(slow_greeting(delay=0.005, tokens=200))["api_key"]
    response = harness.client.post(
        "/v1/workflows/run",
        json={"inputs": {"name": "Ned"}, "user": "u1", "response_mode": "streaming"},
        headers={"Authorization": f"Bearer {key}"},
        buffered=False,
    )
    run_id = None
    for message in parse_sse(response.response):
        if not message.is_ping and message.json["event"] == "text_chunk":
            run_id = message.json["workflow_run_id"]
            break
    response.close()  # the client goes away mid-run
    assert run_id is not None
    detail = wait_for_status(harness, key, run_id, "u1", {"succeeded", "failed", "stopped"})
    assert detail["status"] == "succeeded"


def test_stops_by_unknown_tasks_succeed_and_strict_end_users_keep_to_their_own(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    for task_id in ("00000000-0000-4000-8000-000000000000", "not-an-id"):
        unknown = harness.post(f"/v1/workflows/tasks/{task_id}/stop", key, {"user": "u1"})
        assert (unknown.status_code, unknown.json) == (200, {"result": "success"}), task_id
    no_user = harness.post("/v1/workflows/tasks/not-an-id/stop", key, {})
    assert (no_user.status_code, no_user.json["code"]) == (400, "invalid_param")

    strict = AppHarness({**harness.env, "STRICT_END_USER_ACCESS": "true"}, harness.worker)
    try:
        paused = strict.post("/v1/workflows/run", key, {"inputs": {"name": "Hal", "mood": "formal"}, "user": "u4"}).json
        refused = strict.post(f"/v1/workflows/tasks/{paused['task_id']}/stop", key, {"user": "u5"})
        assert (refused.status_code, refused.json["code"]) == (404, "not_found")
        token = paused["data"]["reasons"][0]["form_token"]
        answer = {"inputs": {"approved": "true"}, "action": "submit", "user": "u5"}
        foreign = strict.post(f"/v1/form/human_input/{token}", key, answer)
        assert (foreign.status_code, foreign.json["code"]) == (404, "not_found")
        assert harness.get(f"/v1/workflows/run/{paused['workflow_run_id']}", key).json["status"] == "paused"
        own = strict.post(f"/v1/workflows/tasks/{paused['task_id']}/stop", key, {"user": "u4"})
        assert own.status_code == 200
        wait_for_status(harness, key, paused["workflow_run_id"], "u4", {"stopped"}, timeout=5)
    finally:
        strict.close()


def test_a_method_a_route_does_not_take_is_405_with_allow(harness: AppHarness, greeting: dict[str, str]) -> None:
    response = harness.client.delete("/v1/workflows/run", headers={"Authorization": f"Bearer {greeting['api_key']}"})
    assert response.status_code == 405 and response.json["code"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"].split(", ")
    detail = harness.client.post("/v1/workflows/run/x", headers={"Authorization": f"Bearer {greeting['api_key']}"})
    assert detail.status_code == 405 and "GET" in detail.headers["Allow"].split(", ")
