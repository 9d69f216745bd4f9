"""``Idempotency-Key`` on ``POST /v1/workflows/run``: a retried start gets the same run, never a second one."""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select

from api.models import WorkflowRun
from api.models.engine import db
from harness.app_database import APP_DATABASES
from harness.sse import parse_sse
from tests.app.conftest import AppHarness
from tests.app.test_service_api import slow_greeting, wait_for_status

pytestmark = pytest.mark.parametrize("app_database", APP_DATABASES, indirect=True, scope="module")


@pytest.fixture(scope="module")
def greeting(harness: AppHarness) -> dict[str, str]:
    return harness.create_app("greeting")


def start(harness: AppHarness, key: str, body: dict[str, Any], idempotency_key: str | None, **kwargs: Any) -> Any:
    headers = {"Authorization": f"Bearer {key}"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return harness.client.post("/v1/workflows/run", json=body, headers=headers, **kwargs)


def runs_of(harness: AppHarness, app_id: str) -> int:
    with harness.app.app_context():
        count = db.session.execute(select(func.count()).where(WorkflowRun.app_id == app_id)).scalar_one()
        db.session.remove()
        return int(count)


def test_the_same_key_and_body_get_the_same_run_in_every_mode(harness: AppHarness, greeting: dict[str, str]) -> None:
    key, app_id = greeting["api_key"], greeting["app_id"]
    before = runs_of(harness, app_id)
    blocking = {"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "blocking"}
    idem = uuid.uuid4().hex
    first = start(harness, key, blocking, idem)
    again = start(harness, key, dict(reversed(list(blocking.items()))), idem)  # the same body, spelled otherwise
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert again.json == first.json and first.json["data"]["status"] == "succeeded"

    async_body = {"inputs": {"name": "Bo"}, "user": "u1", "response_mode": "async"}
    idem = uuid.uuid4().hex
    queued, requeued = start(harness, key, async_body, idem), start(harness, key, async_body, idem)
    assert queued.status_code == requeued.status_code == 202 and queued.json == requeued.json
    wait_for_status(harness, key, queued.json["workflow_run_id"], "u1", {"succeeded"})

    streaming = {"inputs": {"name": "Cy"}, "user": "u1", "response_mode": "streaming"}
    idem = uuid.uuid4().hex
    live = start(harness, key, streaming, idem, buffered=False)
    run_id = live.headers["X-Workflow-Run-Id"]
    live_events = [m.json for m in parse_sse(live.response) if not m.is_ping]
    replay = start(harness, key, streaming, idem, buffered=False)
    assert replay.headers["X-Workflow-Run-Id"] == run_id and replay.headers["Idempotent-Replayed"] == "true"
    replayed = [m for m in parse_sse(replay.response) if not m.is_ping]
    assert [m.json for m in replayed] == live_events, "the retry streams the same run from its start"
    assert all(m.id for m in replayed)
    assert runs_of(harness, app_id) == before + 3


def test_a_key_used_with_another_body_is_422(harness: AppHarness, greeting: dict[str, str]) -> None:
    key, app_id = greeting["api_key"], greeting["app_id"]
    idem = uuid.uuid4().hex
    assert start(harness, key, {"inputs": {"name": "Di"}, "user": "u1"}, idem).status_code == 200
    before = runs_of(harness, app_id)
    other = start(harness, key, {"inputs": {"name": "Ed"}, "user": "u1"}, idem)
    assert other.status_code == 422 and other.json["code"] == "idempotency_key_reused"
    assert runs_of(harness, app_id) == before


def test_keys_are_scoped_to_the_end_user(harness: AppHarness, greeting: dict[str, str]) -> None:
    key, idem = greeting["api_key"], uuid.uuid4().hex
    body = {"inputs": {"name": "Fa"}, "response_mode": "async"}
    mine = start(harness, key, {**body, "user": "u1"}, idem).json
    theirs = start(harness, key, {**body, "user": "u2"}, idem).json
    assert mine["workflow_run_id"] != theirs["workflow_run_id"]


@pytest.mark.parametrize("bad", ["", "x" * 256, "has space", "tab\there", "é"])
def test_a_malformed_key_is_400(harness: AppHarness, greeting: dict[str, str], bad: str) -> None:
    key, app_id = greeting["api_key"], greeting["app_id"]
    before = runs_of(harness, app_id)
    response = harness.client.post(
        "/v1/workflows/run",
        json={"inputs": {"name": "Gu"}, "user": "u1"},
        headers={"Authorization": f"Bearer {key}", "Idempotency-Key": bad.encode().decode("latin-1")},
    )
    assert response.status_code == 400 and response.json["code"] == "invalid_param"
    assert runs_of(harness, app_id) == before


def test_concurrent_retries_of_one_key_start_one_run(harness: AppHarness) -> None:
    created = harness.create_app(slow_greeting(delay=0.01, tokens=50))
    key, idem = created["api_key"], uuid.uuid4().hex
    body = {"inputs": {"name": "Hu"}, "user": "u1", "response_mode": "async"}

    def post(_: int) -> tuple[int, str]:
        with harness.app.test_client() as client:
            response = client.post(
                "/v1/workflows/run", json=body, headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem}
            )
            return response.status_code, response.json["workflow_run_id"]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(post, range(6)))
    assert {status for status, _ in answers} == {202}
    assert len({run_id for _, run_id in answers}) == 1
    assert runs_of(harness, created["app_id"]) == 1
    wait_for_status(harness, key, answers[0][1], "u1", {"succeeded"})


def test_a_blocking_retry_waits_for_the_run_it_started(harness: AppHarness) -> None:
    created = harness.create_app(slow_greeting(delay=0.01, tokens=100))
    key, idem = created["api_key"], uuid.uuid4().hex
    queued = start(harness, key, {"inputs": {"name": "Io"}, "user": "u1", "response_mode": "async"}, idem)
    # The same key with another mode is another body: refused.
    assert start(harness, key, {"inputs": {"name": "Io"}, "user": "u1"}, idem).status_code == 422
    blocking = {"inputs": {"name": "Jo"}, "user": "u1", "response_mode": "blocking"}
    idem = uuid.uuid4().hex
    with concurrent.futures.ThreadPoolExecutor(2) as pool:

        def post(_: int) -> Any:
            with harness.app.test_client() as client:
                return client.post(
                    "/v1/workflows/run",
                    json=blocking,
                    headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem},
                ).json

        first, second = pool.map(post, range(2))
    assert first == second and first["data"]["status"] == "succeeded"
    assert runs_of(harness, created["app_id"]) == 2
    wait_for_status(harness, key, queued.json["workflow_run_id"], "u1", {"succeeded"})
