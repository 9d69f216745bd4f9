"""Every example DSL end to end: created with ``flask create-app``, run by a real Celery worker on graphon,
its events read back from the run's topic on the embedded SQLite store and on Redis, each held to Dify's
published spec and to the fields of Dify's stream models; the greeting's form answered by its token and
the run resumed; a stop of a streaming model ends the run within the stop check interval plus 100 ms."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from harness.services import redis_url
from harness.waiting import wait_until
from tests.app import examples
from tests.app.conftest import AppHarness
from tests.app.dify_spec import event_schema, validate_spec
from tests.app.loopback import greeting_service
from tests.app.test_dify_models import DIFY_DATA_FIELDS, ENVELOPE
from tests.app.test_service_api import wait_for_status

pytestmark = pytest.mark.timeout(240)

STORES: dict[str, Callable[[], dict[str, str]]] = {
    "sqlite": dict,
    "redis": lambda: {
        "DURABLE_STREAM_URL": redis_url(0, f"key_prefix=dsl-{uuid.uuid4().hex[:8]}"),
        "REDIS_URL": redis_url(0),
    },
}
USER = "dsl-user"


def check(events: list[dict[str, Any]], what: str) -> None:
    for event in events:
        name = event["event"]
        validate_spec(event_schema(name), event, f"{name} of {what}")
        assert set(event) == ENVELOPE, what
        assert set(event["data"]) == DIFY_DATA_FIELDS[name], f"{name} of {what}: {sorted(event['data'])}"


def run_blocking(harness: AppHarness, key: str, inputs: dict[str, Any]) -> dict[str, Any]:
    answer = harness.post("/v1/workflows/run", key, {"inputs": inputs, "user": USER, "response_mode": "blocking"})
    assert answer.status_code == 200, answer.json
    body: dict[str, Any] = answer.json
    return body


@pytest.mark.parametrize("store", sorted(STORES))
def test_every_example_runs_through_celery_and_its_events_are_dify_s(
    make_harness: Callable[..., AppHarness], store: str
) -> None:
    harness = make_harness(WORKFLOW_HTTP_ALLOWED_HOSTS="127.0.0.1", **STORES[store]())
    seen: set[str] = set()

    greeting = harness.create_app("greeting")["api_key"]
    casual = run_blocking(harness, greeting, {"name": "Ada"})
    assert casual["data"]["status"] == "succeeded" and casual["data"]["outputs"]["greeting"].startswith("Hello Ada!")
    events = harness.events(casual["workflow_run_id"])
    check(events, "the casual greeting")
    text = "".join(e["data"]["text"] for e in events if e["event"] == "text_chunk")
    assert text == casual["data"]["outputs"]["greeting"]
    seen |= {e["event"] for e in events}

    paused = run_blocking(harness, greeting, {"name": "Ada", "mood": "formal"})
    assert paused["data"]["status"] == "paused"
    token = paused["data"]["reasons"][0]["form_token"]
    answer = {"inputs": {"approved": "true"}, "action": "submit", "user": USER}
    answered = harness.post(f"/v1/form/human_input/{token}", greeting, answer)
    assert answered.status_code == 200, answered.json
    done = wait_for_status(harness, greeting, paused["workflow_run_id"], USER, {"succeeded", "failed"})
    assert done["status"] == "succeeded" and done["outputs"]["greeting"].endswith("(approved: true)")
    events = harness.events(paused["workflow_run_id"])
    check(events, "the formal greeting")
    assert [e["data"]["reason"] for e in events if e["event"] == "workflow_started"] == ["initial", "resumption"]
    seen |= {e["event"] for e in events}

    iteration = harness.create_app("iteration")["api_key"]
    people = {"people": {"names": [f"p{i}" for i in range(50)]}}
    iterated = run_blocking(harness, iteration, people)
    assert len(iterated["data"]["outputs"]["greetings"]) == 50
    events = harness.events(iterated["workflow_run_id"])
    check(events, "the iteration")
    seen |= {e["event"] for e in events}

    loop = harness.create_app("loop")["api_key"]
    looped = run_blocking(harness, loop, {"target": 3})
    assert looped["data"]["outputs"] == {"count": 3, "lines": ["turn 1", "turn 2", "turn 3"]}
    events = harness.events(looped["workflow_run_id"])
    check(events, "the loop")
    seen |= {e["event"] for e in events}

    with greeting_service() as url:
        definition = examples.example("http")
        examples.node_data(definition, "ask")["url"] = url
        http = harness.create_app(definition)["api_key"]
        asked = run_blocking(harness, http, {"name": "Ada"})
    assert asked["data"]["status"] == "succeeded" and "Hello Ada from the service" in asked["data"]["outputs"]["answer"]
    events = harness.events(asked["workflow_run_id"])
    check(events, "the HTTP request")
    seen |= {e["event"] for e in events}

    assert {"iteration_started", "iteration_next", "iteration_completed", "loop_started", "loop_completed"} <= seen
    assert {"human_input_required", "workflow_paused", "human_input_form_filled", "text_chunk"} <= seen


@pytest.mark.parametrize("store", sorted(STORES))
def test_a_stop_mid_stream_ends_the_run_within_the_check_interval_and_100_ms(
    make_harness: Callable[..., AppHarness], store: str
) -> None:
    interval = 0.02  # WORKFLOW_STOP_CHECK_INTERVAL, the test's own setting
    harness = make_harness(WORKFLOW_STOP_CHECK_INTERVAL=interval, **STORES[store]())
    slow = examples.script_model(
        examples.greeting(), response=" ".join(f"word{i}" for i in range(2000)), token_delay=0.02
    )
    key = harness.create_app(slow)["api_key"]
    started = harness.post(
        "/v1/workflows/run", key, {"inputs": {"name": "Ada"}, "user": USER, "response_mode": "async"}
    )
    assert started.status_code == 202, started.json
    run_id, task_id = started.json["workflow_run_id"], started.json["task_id"]

    def streaming() -> bool:
        return sum(e["event"] == "text_chunk" for e in harness.events(run_id)) >= 5

    wait_until(streaming, 30, "the model to stream")
    stopped_at = time.time()
    stop = harness.post(f"/v1/workflows/tasks/{task_id}/stop", key, {"user": USER})
    assert stop.status_code == 200, stop.json
    wait_for_status(harness, key, run_id, USER, {"stopped"}, timeout=30)
    events = harness.events(run_id)
    chunks = [e for e in events if e["event"] == "text_chunk"]
    # Each record carries the time it was appended; the last chunk went in at most one check interval,
    # one token and 100 ms after the stop was asked for.
    records = harness.records(run_id)
    last_chunk_at = max(appended for appended, event in records if event["event"] == "text_chunk")
    assert last_chunk_at - stopped_at <= interval + 0.02 + 0.1, last_chunk_at - stopped_at
    assert len(chunks) < 2000 and events[-1]["data"]["status"] == "stopped"
    draft = [e for e in events if e["event"] == "node_finished" and e["data"]["node_id"] == "draft"]
    assert draft and draft[0]["data"]["status"] == "stopped"
