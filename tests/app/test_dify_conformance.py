"""Dify conformance: real runs, checked against the JSON Schemas of ``tests/app/dify_schemas``.

The schemas are Dify's published Workflow App API reference as ``docs/dify-compatibility.md`` applies
it. The runs go through the API in-process and a real Celery worker, on SQLite and PostgreSQL app
databases and on both event transports: the rollout flag may change the ``id:`` lines and nothing else.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.app_database import APP_DATABASES, app_database_uri
from harness.app_env import base_env
from harness.processes import running_worker
from harness.services import redis_url
from harness.sse import SseMessage, parse_sse
from harness.waiting import wait_until
from tests.app import examples
from tests.app.conftest import AppHarness
from tests.app.dify_schemas import EVENT_NAMES, load_schema, registry, schema_names, validate, validate_event, validator
from tests.app.dify_spec import event_schema, response_schema, validate_spec

TRANSPORTS = ("durable_stream", "broadcast_channel")
USER = "dify-conformance"
ADA = {"name": "Ada"}
FORMAL_ADA = {"name": "Ada", "mood": "formal"}  # the greeting's formal branch waits for a human
# Every run here takes well under a second (the slow one about 4 s if nobody stops it); a stream
# still open after this long is a hang, not a slow machine.
STREAM_DEADLINE = 30.0

on_both_databases = pytest.mark.parametrize("app_database", APP_DATABASES, indirect=True, scope="module")
on_both_transports = pytest.mark.parametrize("transport", TRANSPORTS)


def slow_greeting() -> dict[str, Any]:
    """The greeting app with an answer long and slow enough (~4 s) to be stopped while it streams."""
    definition: dict[str, Any] = examples.greeting()
    definition = copy.deepcopy(definition)
    definition["name"] = "Slow greeting"
    definition = examples.script_model(definition, response=" ".join(f"word{i}" for i in range(400)))
    definition = examples.script_model(definition, token_delay=0.01)
    return definition


@dataclasses.dataclass
class Target:
    """One stack under test: the API in-process and a worker process, on one database and one transport."""

    transport: str
    harness: AppHarness
    greeting: dict[str, str]
    slow: dict[str, str]

    @property
    def durable(self) -> bool:
        return self.transport == "durable_stream"

    @property
    def key(self) -> str:
        return self.greeting["api_key"]

    def post(self, path: str, body: Any, key: str | None = None) -> Any:
        return self.harness.post(path, key or self.key, body)

    def get(self, path: str, key: str | None = None) -> Any:
        return self.harness.get(path, key or self.key)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory, app_database: str) -> Iterator[Callable[[str], Target]]:
    """The module's stacks on this database, one per transport, built on first use and shared by every test."""
    with contextlib.ExitStack() as stack:
        built: dict[str, Target] = {}

        def target_for(transport: str) -> Target:
            if transport not in built:
                var_dir = tmp_path_factory.mktemp(f"dify-{app_database}-{transport}")
                uri = stack.enter_context(app_database_uri(app_database, var_dir))
                overrides = {"SQLALCHEMY_DATABASE_URI": uri, "WORKFLOW_EVENT_TRANSPORT": transport}
                if transport == "broadcast_channel":
                    overrides["REDIS_URL"] = redis_url(0)
                env = base_env(var_dir, **overrides)
                worker = stack.enter_context(running_worker(env, var_dir / "worker.log"))
                harness = AppHarness(env, worker)
                stack.callback(harness.close)
                built[transport] = Target(
                    transport, harness, harness.create_app("greeting"), harness.create_app(slow_greeting())
                )
            return built[transport]

        yield target_for


@pytest.fixture
def target(targets: Callable[[str], Target], transport: str) -> Target:
    return targets(transport)


class Stream:
    """An open ``text/event-stream`` response, read a message at a time against a deadline."""

    def __init__(self, response: Any) -> None:
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.mimetype == "text/event-stream", response.mimetype
        self.response = response
        self.messages: list[SseMessage] = []
        self._deadline = time.monotonic() + STREAM_DEADLINE
        self._messages = parse_sse(response.response)

    def next_message(self) -> SseMessage:
        message = next(self._messages, None)
        assert message is not None, f"the stream ended early after {self.messages}"
        return self._took(message)

    def read(self, until: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Read to the end of the stream, or up to the first data event that ``until`` accepts."""
        for message in self._messages:
            self._took(message)
            if until is not None and is_data(message) and until(message.json):
                return

    def _took(self, message: SseMessage) -> SseMessage:
        self.messages.append(message)
        assert time.monotonic() < self._deadline, f"the stream was still going after {STREAM_DEADLINE:g} s"
        return message

    def close(self) -> None:
        self.response.close()


def is_data(message: SseMessage) -> bool:
    return message.event is None and bool(message.data)


def open_stream(target: Target, path: str, body: Any = None, key: str | None = None) -> Stream:
    headers = {"Authorization": f"Bearer {key or target.key}"}
    client = target.harness.client
    if body is None:
        return Stream(client.get(path, headers=headers, buffered=False))
    return Stream(client.post(path, json=body, headers=headers, buffered=False))


def start_streaming(target: Target, inputs: dict[str, Any], key: str | None = None) -> tuple[Stream, str, str]:
    """A streaming run's open stream and its task and run ids, which come in the headers before any event."""
    body = {"inputs": inputs, "user": USER, "response_mode": "streaming"}
    stream = open_stream(target, "/v1/workflows/run", body, key)
    task_id, run_id = stream.response.headers.get("X-Task-Id"), stream.response.headers.get("X-Workflow-Run-Id")
    assert task_id and run_id, f"X-Task-Id and X-Workflow-Run-Id must be headers: {dict(stream.response.headers)}"
    return stream, task_id, run_id


def conforming_events(
    target: Target, messages: list[SseMessage], task_id: str, run_id: str, check_ids: bool = True
) -> list[dict[str, Any]]:
    """The data events of ``messages``, each checked against its schema and the transport's ``id:`` rule."""
    assert messages and messages[0].is_ping, f"the first message must be `event: ping`, not {messages[:1]}"
    events = []
    for index, message in enumerate(messages):
        if message.is_ping:
            continue
        if message.event == "error":
            validate("error_body", message.json, f"the error message {index}")
            raise AssertionError(f"the stream carried an error at message {index}: {message.data}")
        # Dify's parsers take every event from its data line; an extra `event:` line would make them
        # treat it as something else (our streams name only pings and errors that way).
        assert message.event is None, f"message {index} has an `event: {message.event}` line: {message}"
        event = message.json
        validate_event(event, f"message {index} ({event.get('event')!r}) on {target.transport}")
        validate_spec(event_schema(event["event"]), event, f"message {index} on {target.transport}")
        assert (event["task_id"], event["workflow_run_id"]) == (task_id, run_id), f"message {index}: {event}"
        if check_ids and target.durable:
            assert message.id, f"message {index} has no `id:` line on the durable transport: {message}"
        elif check_ids:
            assert message.id is None, f"message {index} has an `id:` line on the broadcast channel: {message}"
        events.append(event)
    return events


def streaming_run(target: Target, inputs: dict[str, Any], key: str | None = None) -> list[dict[str, Any]]:
    stream, task_id, run_id = start_streaming(target, inputs, key)
    try:
        stream.read()
    finally:
        stream.close()
    return conforming_events(target, stream.messages, task_id, run_id)


def names(events: list[dict[str, Any]]) -> list[str]:
    return [event["event"] for event in events]


def outline(events: list[dict[str, Any]]) -> str:
    """The events' names for a failure message, runs of text chunks folded (pytest cuts long lists short)."""
    parts: list[str] = []
    for name in names(events):
        if parts and name == "text_chunk" and parts[-1].startswith("text_chunk"):
            count = int(parts[-1].partition(" * ")[2] or 1) + 1
            parts[-1] = f"text_chunk * {count}"
        else:
            parts.append(name)
    return ", ".join(parts)


def blocking_run(target: Target, inputs: dict[str, Any], schema: str) -> dict[str, Any]:
    response = target.post("/v1/workflows/run", {"inputs": inputs, "user": USER, "response_mode": "blocking"})
    assert response.status_code == 200, response.get_data(as_text=True)
    body: dict[str, Any] = response.json
    validate(schema, body, f"the blocking response on {target.transport}")
    validate_spec(response_schema("POST", "/workflows/run"), body, "the blocking response")
    assert body["data"]["id"] == body["workflow_run_id"]
    return body


def run_detail(target: Target, run_id: str, key: str | None = None) -> dict[str, Any]:
    response = target.get(f"/v1/workflows/run/{run_id}?user={USER}", key)
    assert response.status_code == 200, response.get_data(as_text=True)
    detail: dict[str, Any] = response.json
    validate("run_detail", detail, "the run detail")
    validate_spec(response_schema("GET", "/workflows/run/{workflow_run_id}"), detail, "the run detail")
    assert detail["id"] == run_id
    return detail


def expect_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, f"expected {status} {code}, got {response.status_code}: {response.json}"
    validate("error_body", response.json, f"the {status} body")
    assert (response.json["code"], response.json["status"]) == (code, status), response.json


# The schemas themselves, without a server.


def test_there_is_a_valid_draft_2020_12_schema_for_every_response_and_event() -> None:
    expected = {
        "common",
        "blocking_response",
        "blocking_response_paused",
        "run_detail",
        "stop_response",
        "form_get_response",
        "form_post_response",
        "error_body",
        *(f"event_{name}" for name in EVENT_NAMES),
    }
    assert set(schema_names()) == expected
    for name in sorted(expected):
        schema = load_schema(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", name
        validator(name)  # checks the schema against the draft's metaschema
        resolver = registry().resolver(base_uri=schema["$id"])
        for ref in references(schema):
            resolver.lookup(ref)  # raises if a $ref points nowhere
        if name not in ("common", "form_post_response"):
            # Dify adds fields over time: a client must take them, so the schemas do too.
            assert schema["additionalProperties"] is True, name


def references(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "$ref":
                yield value
            else:
                yield from references(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from references(item)


def finished_event(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "run-1",
        "workflow_id": "app-1",
        "status": "succeeded",
        "outputs": {"greeting": "hi"},
        "error": None,
        "elapsed_time": 0.25,
        "total_tokens": 12,
        "total_steps": 4,
        "created_at": 1_760_000_000,
        "finished_at": 1_760_000_001,
        "created_by": {"id": "user-1", "user": "u1"},
        "exceptions_count": 0,
        "files": [],
    }
    data.update(changes)
    return {"event": "workflow_finished", "task_id": "task-1", "workflow_run_id": "run-1", "data": data}


def test_the_schemas_are_strict_about_documented_fields_and_types() -> None:
    validate_event(finished_event())
    validate_event(finished_event(surprise="Dify may add fields"))
    loose: list[tuple[dict[str, Any], str]] = [
        ({"total_tokens": 12.0}, "$.data.total_tokens"),  # an int, not a float that happens to be whole
        ({"total_tokens": "12"}, "$.data.total_tokens"),
        ({"created_at": 1_760_000_000_000}, "$.data.created_at"),  # seconds, not milliseconds
        ({"elapsed_time": "0.25"}, "$.data.elapsed_time"),
        ({"status": "running"}, "$.data.status"),
        ({"status": "failed"}, "$.data.error"),  # a failure says why
    ]
    for changes, path in loose:
        with pytest.raises(AssertionError, match=r"event_workflow_finished\.json") as raised:
            validate_event(finished_event(**changes))
        assert path in str(raised.value), (changes, str(raised.value))
    missing = finished_event()
    del missing["data"]["exceptions_count"]
    with pytest.raises(AssertionError, match=r"\$\.data: 'exceptions_count' is a required property"):
        validate_event(missing)
    with pytest.raises(AssertionError, match="not a documented workflow event"):
        validate_event({"event": "run_created", "task_id": "t", "workflow_run_id": "r"})
    validate("form_post_response", {})
    with pytest.raises(AssertionError, match=r"form_post_response\.json"):
        validate("form_post_response", {"result": "success"})
    with pytest.raises(AssertionError, match=r"\$: 'run' is a required property"):
        validate("error_body", {"code": "run_events_lost", "message": "gone", "status": 410})


# Real runs, on both databases and both transports.


@on_both_databases
@on_both_transports
def test_a_blocking_run_and_its_detail_conform(target: Target) -> None:
    body = blocking_run(target, ADA, "blocking_response")
    data = body["data"]
    assert data["status"] == "succeeded" and data["error"] is None and data["total_steps"] == 4
    assert data["outputs"]["greeting"].startswith("Hello Ada!")
    assert data["finished_at"] >= data["created_at"]

    detail = run_detail(target, body["workflow_run_id"])
    assert detail["status"] == "succeeded" and detail["outputs"] == data["outputs"]
    assert json.loads(detail["inputs"])["name"] == "Ada" and detail["total_tokens"] == data["total_tokens"]


@on_both_databases
@on_both_transports
def test_a_streaming_run_conforms_event_by_event(target: Target) -> None:
    events = streaming_run(target, ADA)
    assert names(events)[0] == "workflow_started" and names(events)[-1] == "workflow_finished", outline(events)

    started, finished = events[0]["data"], events[-1]["data"]
    assert started["reason"] == "initial" and started["id"] == events[0]["workflow_run_id"]
    inputs = started["inputs"]
    assert inputs["name"] == "Ada" and inputs["sys.user_id"] == USER and inputs["sys.workflow_run_id"] == started["id"]
    assert inputs["sys.app_id"] == target.greeting["app_id"] and inputs["sys.workflow_id"] == started["workflow_id"]
    assert finished["status"] == "succeeded" and finished["id"] == started["id"]
    text = "".join(event["data"]["text"] for event in events if event["event"] == "text_chunk")
    assert text == finished["outputs"]["greeting"] and text.startswith("Hello Ada!")

    # The path as Dify's canvas draws it: each node names the node the engine came from.
    node_starts = [event["data"] for event in events if event["event"] == "node_started"]
    node_ends = [event["data"] for event in events if event["event"] == "node_finished"]
    assert [node["node_id"] for node in node_starts] == ["start", "is_formal", "draft", "casual_end"]
    assert [node["predecessor_node_id"] for node in node_starts] == [None, "start", "is_formal", "draft"]
    assert [node["id"] for node in node_ends] == [node["id"] for node in node_starts]
    assert all(node["status"] == "succeeded" for node in node_ends)
    # The run's tokens are its llm nodes' tokens.
    llm_tokens = sum(node["execution_metadata"]["total_tokens"] for node in node_ends if node["node_type"] == "llm")
    assert finished["total_tokens"] == llm_tokens > 0


@on_both_databases
@on_both_transports
def test_a_pause_conforms_streaming_and_blocking(target: Target) -> None:
    events = streaming_run(target, FORMAL_ADA)
    assert names(events)[0] == "workflow_started", outline(events)
    assert names(events)[-2:] == ["human_input_required", "workflow_paused"], outline(events)
    assert "workflow_finished" not in names(events), outline(events)
    required, paused = events[-2]["data"], events[-1]["data"]
    assert required["node_id"] == "approve" and required["display_in_ui"] is True
    assert required["expiration_time"] > time.time()
    fields = {field["output_variable_name"]: field for field in required["inputs"]}
    assert fields["approved"]["type"] == "select" and fields["approved"]["option_source"]["value"] == ["true", "false"]
    assert fields["note"] == {"output_variable_name": "note", "type": "paragraph", "default": None}
    assert [action["id"] for action in required["actions"]] == ["submit"], "the graph names no action: one default"
    assert paused["paused_nodes"] == ["approve"] and paused["workflow_run_id"] == events[-1]["workflow_run_id"]
    assert [(reason["form_id"], reason["form_token"]) for reason in paused["reasons"]] == [
        (required["form_id"], required["form_token"])
    ]

    blocking = blocking_run(target, FORMAL_ADA, "blocking_response_paused")
    assert blocking["data"]["paused_nodes"] == ["approve"]
    assert run_detail(target, blocking["workflow_run_id"])["status"] == "paused"


@on_both_databases
@on_both_transports
def test_a_form_filled_by_token_resumes_the_run(target: Target) -> None:
    paused = blocking_run(target, FORMAL_ADA, "blocking_response_paused")
    run_id, task_id = paused["workflow_run_id"], paused["task_id"]
    form_url = f"/v1/form/human_input/{paused['data']['reasons'][0]['form_token']}"

    form = target.get(form_url)
    assert form.status_code == 200, form.json
    validate("form_get_response", form.json, "the form")
    validate_spec(response_schema("GET", "/form/human_input/{form_token}"), form.json, "the form")
    assert {field["output_variable_name"] for field in form.json["inputs"]} == {"approved", "note"}
    action = form.json["user_actions"][0]
    answer = {"inputs": {"approved": "true"}, "action": action["id"], "user": USER}

    # Refusals first: none of them may use the form up.
    expect_error(target.get("/v1/form/human_input/no-such-token"), 404, "not_found")
    expect_error(target.post("/v1/form/human_input/no-such-token", answer), 404, "not_found")
    expect_error(target.post(form_url, {**answer, "inputs": {"approved": True}}), 400, "invalid_form_data")
    expect_error(target.post(form_url, {**answer, "action": "no-such-action"}), 400, "invalid_form_data")
    expect_error(target.post(form_url, {"inputs": answer["inputs"], "action": action["id"]}), 400, "invalid_param")

    stream: Stream | None = None
    if not target.durable:
        # Live-only: what nobody listens to when it is sent is gone, so the resumed run's events need a
        # listener before the answer goes in (its ping says the stream is open).
        stream = open_stream(target, f"/v1/workflow/{run_id}/events?user={USER}")
        assert stream.next_message().is_ping
    try:
        submitted = target.post(form_url, answer)
        assert submitted.status_code == 200, submitted.json
        validate("form_post_response", submitted.json, "the submission's answer")
        if stream is None:
            stream = open_stream(target, f"/v1/workflow/{run_id}/events?user={USER}&include_state_snapshot=true")
        stream.read(until=lambda event: event["event"] == "workflow_finished")
    finally:
        if stream is not None:
            stream.close()
    events = conforming_events(target, stream.messages, task_id, run_id)

    if target.durable:  # the snapshot is the retained run from its beginning, the pause included
        assert events[0]["event"] == "workflow_started" and events[0]["data"]["reason"] == "initial"
        assert "workflow_paused" in names(events), outline(events)
    assert names(events)[-1] != "workflow_paused", (
        "the stream ended at a replayed pause that the run had moved past (its form was accepted): " + outline(events)
    )
    resumptions = [
        i for i, e in enumerate(events) if e["event"] == "workflow_started" and e["data"]["reason"] == "resumption"
    ]
    assert len(resumptions) == 1, outline(events)
    # graphon's response filter may put the end node's text before the node events around it: the order
    # that matters is the one of the other events.
    resumed = [event for event in events[resumptions[0] :] if event["event"] != "text_chunk"]
    assert names(resumed)[:4] == ["workflow_started", "node_started", "human_input_form_filled", "node_finished"], (
        outline(resumed)
    )
    assert resumed[1]["data"]["node_id"] == "approve"
    filled, approved = resumed[2]["data"], resumed[3]["data"]
    assert (filled["node_id"], filled["action_id"], filled["action_text"]) == ("approve", action["id"], action["title"])
    assert approved["node_id"] == "approve" and approved["status"] == "succeeded"
    assert approved["outputs"]["approved"] == "true" and approved["outputs"]["__action_id"] == action["id"]
    assert approved["outputs"]["__rendered_content"] == filled["rendered_content"]
    finished = resumed[-1]
    assert finished["event"] == "workflow_finished" and finished["data"]["status"] == "succeeded", outline(resumed)
    assert finished["data"]["outputs"]["greeting"].endswith("(approved: true)")

    expect_error(target.post(form_url, answer), 412, "human_input_form_submitted")
    expect_error(target.get(form_url), 412, "human_input_form_submitted")
    detail = run_detail(target, run_id)
    assert detail["status"] == "succeeded" and detail["outputs"] == finished["data"]["outputs"]


@on_both_databases
@on_both_transports
def test_a_stopped_streaming_run_conforms(target: Target) -> None:
    key = target.slow["api_key"]
    stream, task_id, run_id = start_streaming(target, ADA, key)
    try:
        stream.read(until=lambda event: event["event"] == "text_chunk")
        stopped = target.post(f"/v1/workflows/tasks/{task_id}/stop", {"user": USER}, key)
        assert stopped.status_code == 200, stopped.json
        validate("stop_response", stopped.json, "the stop answer")
        validate_spec(response_schema("POST", "/workflows/tasks/{task_id}/stop"), stopped.json, "the stop answer")
        stream.read()
    finally:
        stream.close()
    events = conforming_events(target, stream.messages, task_id, run_id)
    assert names(events)[-1] == "workflow_finished" and events[-1]["data"]["status"] == "stopped", outline(events)
    draft = [
        event["data"] for event in events if event["event"] == "node_finished" and event["data"]["node_id"] == "draft"
    ]
    assert [node["status"] for node in draft] == ["stopped"]

    def stopped_detail() -> dict[str, Any] | None:
        detail = run_detail(target, run_id, key)
        return detail if detail["status"] == "stopped" else None

    assert wait_until(stopped_detail, 10, "the run's detail to say stopped")["finished_at"] is not None


@on_both_databases
@on_both_transports
def test_the_events_of_a_finished_run_are_one_workflow_finished(target: Target) -> None:
    body = blocking_run(target, ADA, "blocking_response")
    run_id = body["workflow_run_id"]
    stream = open_stream(target, f"/v1/workflow/{run_id}/events?user={USER}")
    try:
        stream.read()
    finally:
        stream.close()
    # Whether an event rebuilt from the run's row has an `id:` line is left open by the contract.
    events = conforming_events(target, stream.messages, body["task_id"], run_id, check_ids=False)
    assert names(events) == ["workflow_finished"], outline(events)
    assert events[0]["data"]["status"] == "succeeded" and events[0]["data"]["outputs"] == body["data"]["outputs"]


@on_both_databases
@pytest.mark.parametrize("inputs", [ADA, FORMAL_ADA], ids=["finishes", "pauses"])
def test_the_transports_differ_only_in_id_lines(targets: Callable[[str], Target], inputs: dict[str, Any]) -> None:
    shapes = {}
    for transport in TRANSPORTS:
        events = streaming_run(targets(transport), inputs)  # checks the `id:` lines of each transport
        # graphon's response filter may let the end node's text out ahead of the node events around it,
        # and text it held back comes out in fewer, longer chunks, from one run to the next: the other
        # events keep their order, the chunks their shape and the text its characters.
        shapes[transport] = (
            [
                (event["event"], sorted(event), sorted(event["data"]))
                for event in events
                if event["event"] != "text_chunk"
            ],
            {
                (tuple(sorted(event)), tuple(sorted(event["data"])))
                for event in events
                if event["event"] == "text_chunk"
            },
            "".join(event["data"]["text"] for event in events if event["event"] == "text_chunk"),
        )
    assert shapes["durable_stream"] == shapes["broadcast_channel"]
