"""Dify's official Node SDK (npm ``dify-client`` 2.3.2, unchanged) against the app as deployed.

``tests/dify_sdk/drive.mjs`` makes the SDK's own calls (``runWorkflow``, ``sendRequest``) and, for the
human-input form and the event stream, the ``fetch`` calls Dify's web front end makes; it parses event
streams the way that front end does and prints what it saw. These tests hold that report to the wire
contract of ``docs/dify-compatibility.md``: a Dify client must need no change to talk to us.

The SDK comes from ``tests/dify_sdk/package-lock.json`` (``make node-deps``); without it the tests
fail rather than skip, since a skipped compatibility check would read as a passing one.
"""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
import requests

from harness.app_env import base_env
from harness.processes import ROOT
from harness.served_stack import ServedStack
from tests.app import examples

pytestmark = pytest.mark.timeout(300)

DRIVER_DIR = ROOT / "tests" / "dify_sdk"
DRIVER = DRIVER_DIR / "drive.mjs"
#: A scenario's own budget; drive.mjs gives up (and reports what it had) a little before this.
DRIVE_TIMEOUT = 60

GREETING: dict[str, Any] = examples.greeting()
GREETING_TEXT = "Hello Ada! It is a wonderful day to build durable streams together."
#: The greeting's casual path: the nodes a run with the default mood goes through, in order.
CASUAL_PATH = ["start", "is_formal", "draft", "casual_end"]

#: Every event name a Dify client may meet on this API (docs/dify-compatibility.md, "Event payloads").
DIFY_EVENTS = {
    "workflow_started",
    "node_started",
    "text_chunk",
    "node_finished",
    "human_input_required",
    "workflow_paused",
    "human_input_form_filled",
    "human_input_form_timeout",
    "workflow_finished",
}
WORKFLOW_STARTED_KEYS = {"id", "workflow_id", "inputs", "created_at", "reason"}
NODE_STARTED_KEYS = {
    "id",
    "node_id",
    "node_type",
    "title",
    "index",
    "predecessor_node_id",
    "inputs",
    "inputs_truncated",
    "created_at",
    "extras",
    "iteration_id",
    "loop_id",
    "agent_strategy",
}
NODE_FINISHED_KEYS = {
    "id",
    "node_id",
    "node_type",
    "title",
    "index",
    "predecessor_node_id",
    "inputs",
    "inputs_truncated",
    "process_data",
    "process_data_truncated",
    "outputs",
    "outputs_truncated",
    "status",
    "error",
    "elapsed_time",
    "execution_metadata",
    "created_at",
    "finished_at",
    "files",
    "iteration_id",
    "loop_id",
}
#: Dify's execution metadata takes only its own keys (``WorkflowNodeExecutionMetadataKey``).
LLM_METADATA_KEYS = {"total_tokens", "total_price", "currency"}
WORKFLOW_FINISHED_KEYS = {
    "id",
    "workflow_id",
    "status",
    "outputs",
    "error",
    "elapsed_time",
    "total_tokens",
    "total_steps",
    "created_at",
    "finished_at",
    "created_by",
    "exceptions_count",
    "files",
}
HUMAN_INPUT_REQUIRED_KEYS = {
    "form_id",
    "node_id",
    "node_title",
    "form_content",
    "inputs",
    "actions",
    "display_in_ui",
    "form_token",
    "resolved_default_values",
    "expiration_time",
    "approval_channels",
}
WORKFLOW_PAUSED_KEYS = {
    "workflow_run_id",
    "paused_nodes",
    "outputs",
    "reasons",
    "status",
    "created_at",
    "elapsed_time",
    "total_tokens",
    "total_steps",
}
BLOCKING_DATA_KEYS = {
    "id",
    "workflow_id",
    "status",
    "outputs",
    "error",
    "elapsed_time",
    "total_tokens",
    "total_steps",
    "created_at",
    "finished_at",
}
FORM_KEYS = {"form_content", "inputs", "resolved_default_values", "user_actions", "expiration_time"}


def slow_greeting() -> dict[str, Any]:
    """The greeting app whose model takes about three seconds, so a stop sent after its first words
    reaches the run while it is still writing."""
    definition = copy.deepcopy(GREETING)
    definition["name"] = "Slow greeting for the Node SDK"
    definition = examples.script_model(definition, response=" ".join(f"word{i}" for i in range(300)))
    definition = examples.script_model(definition, token_delay=0.01)
    return definition


class Stack:
    def __init__(self, served: ServedStack) -> None:
        self.served = served
        self.base_url = f"{served.urls[0]}/v1"
        self.keys = {"greeting": served.create_app(GREETING), "slow": served.create_app(slow_greeting())}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory: pathlib.Path = tmp_path_factory.mktemp("dify-node-sdk")
    # Pings every second: the SDK's readers must pass over them mid-stream, not only before the first event.
    env = base_env(directory, SSE_PING_INTERVAL="1")
    with ServedStack(env, directory / "stack", servers=1, workers_per_server=2, celery_concurrency=4) as served:
        yield Stack(served)
        assert 500 not in served.statuses(), "the API answered 500"


def drive(stack: Stack, app: str, scenario: str) -> dict[str, Any]:
    """Run one scenario of drive.mjs; its report, plus ``exit_code`` and the ``user`` it ran as."""
    if not (DRIVER_DIR / "node_modules" / "dify-client" / "package.json").is_file():
        pytest.fail(
            "Dify's Node SDK is not installed in tests/dify_sdk/node_modules: run `make node-deps` "
            "(npm ci from tests/dify_sdk/package-lock.json)",
            pytrace=False,
        )
    node = shutil.which("node")
    if node is None:
        pytest.fail("`node` (Node.js 20) is not on PATH; it runs tests/dify_sdk/drive.mjs", pytrace=False)
    user = f"dify-sdk-{scenario}-{uuid.uuid4().hex[:8]}"
    completed = subprocess.run(
        [node, str(DRIVER), stack.base_url, stack.keys[app], user, scenario],
        cwd=DRIVER_DIR,
        capture_output=True,
        text=True,
        timeout=DRIVE_TIMEOUT,
        check=False,
    )
    lines = completed.stdout.strip().splitlines()
    try:
        report: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        pytest.fail(
            f"drive.mjs {scenario} printed no report (exit {completed.returncode})\n"
            f"stdout: {completed.stdout[-3000:]}\nstderr: {completed.stderr[-3000:]}",
            pytrace=False,
        )
    report["exit_code"] = completed.returncode
    report["user"] = user
    return report


def ran_through(report: Mapping[str, Any]) -> None:
    """drive.mjs got to the end of its scenario (the SDK threw nothing, every stream was read)."""
    error = report.get("error")
    detail = ""
    if isinstance(error, dict):
        detail = f": {error.get('message')}"
        if "status" in error:
            detail += f" (HTTP {error['status']}: {str(error.get('body'))[:1000]})"
    assert report["exit_code"] == 0 and error is None, f"drive.mjs {report['scenario']} failed{detail}"


def names(events: Sequence[Mapping[str, Any]]) -> list[Any]:
    return [event.get("event") for event in events]


def of(events: Sequence[Mapping[str, Any]], name: str) -> list[dict[str, Any]]:
    return [dict(event["data"]) for event in events if event.get("event") == name]


def lacks(data: Mapping[str, Any], keys: set[str]) -> list[str]:
    return sorted(keys - set(data))


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_envelopes(stream: Mapping[str, Any]) -> None:
    """Every data message is a Dify event ``{"event", "task_id", "workflow_run_id", "data"}`` on a
    ``data: `` line, and the first is ``workflow_started``."""
    events: list[dict[str, Any]] = stream["events"]
    assert events, "the stream carried no event"
    assert stream["bare_data_lines"] == 0, "Dify's web front end reads only `data: ` lines (with the space)"
    first = events[0].get("event") if isinstance(events[0], dict) else events[0]
    assert first == "workflow_started", f"the first data event is {first!r}, not workflow_started: {names(events)[:5]}"
    for index, event in enumerate(events):
        assert isinstance(event, dict), f"event {index} is not a JSON object: {event!r}"
        missing = lacks(event, {"event", "task_id", "workflow_run_id", "data"})
        assert not missing, f"event {index} ({event.get('event')!r}) lacks {missing}: {str(event)[:500]}"
        assert event["event"] in DIFY_EVENTS, (
            f"event {index} is {event['event']!r}, not a Dify workflow event (a Dify client has no handler for it)"
        )
        assert isinstance(event["data"], dict), f"event {index} ({event['event']}) has data {event['data']!r}"


def check_workflow_started(data: Mapping[str, Any], run_id: str, user: str, reason: str) -> None:
    missing = lacks(data, WORKFLOW_STARTED_KEYS)
    assert not missing, f"workflow_started lacks {missing}: {data}"
    assert data["id"] == run_id
    assert data["reason"] == reason
    assert is_int(data["created_at"]), data
    inputs = data["inputs"]
    assert inputs.get("name") == "Ada", inputs
    assert inputs.get("sys.user_id") == user, inputs
    assert inputs.get("sys.workflow_run_id") == run_id, inputs
    assert {"sys.app_id", "sys.workflow_id", "sys.files"} <= set(inputs), inputs


def check_workflow_finished(data: Mapping[str, Any], status: str) -> None:
    missing = lacks(data, WORKFLOW_FINISHED_KEYS)
    assert not missing, f"workflow_finished lacks {missing}: {data}"
    assert data["status"] == status, f"workflow_finished is {data['status']!r} ({data.get('error')!r})"
    assert is_number(data["elapsed_time"]), data
    assert is_int(data["total_tokens"]) and is_int(data["total_steps"]), data
    assert is_int(data["created_at"]) and is_int(data["finished_at"]), data


def check_human_input_required(data: Mapping[str, Any]) -> None:
    missing = lacks(data, HUMAN_INPUT_REQUIRED_KEYS)
    assert not missing, f"human_input_required lacks {missing}: {data}"
    assert data["node_id"] == "approve" and data["node_title"] == "Approve the greeting", data
    fields = {field.get("output_variable_name"): field for field in data["inputs"]}
    assert fields.get("approved", {}).get("type") == "select", data["inputs"]
    assert fields["approved"]["option_source"]["value"] == ["true", "false"], data["inputs"]
    assert [action.get("id") for action in data["actions"]] == ["submit"], data["actions"]
    assert all({"id", "title", "button_style"} <= set(action) for action in data["actions"]), data["actions"]
    assert isinstance(data["form_token"], str) and data["form_token"], data
    assert is_int(data["expiration_time"]) and data["expiration_time"] > time.time(), data


def test_blocking_run_answers_what_dify_documents(stack: Stack) -> None:
    blocking = drive(stack, "greeting", "blocking")
    ran_through(blocking)
    assert blocking["status"] == 200
    body = blocking["body"]
    assert {"workflow_run_id", "task_id", "data"} <= set(body), body
    data = body["data"]
    missing = lacks(data, BLOCKING_DATA_KEYS)
    assert not missing, f"the blocking response's data lacks {missing}: {data}"
    assert data["id"] == body["workflow_run_id"]
    assert data["status"] == "succeeded", data
    assert data["outputs"] == {"greeting": GREETING_TEXT}
    assert data["error"] is None
    assert is_number(data["elapsed_time"]), data
    assert is_int(data["total_tokens"]) and data["total_tokens"] > 0, f"total_tokens: {data['total_tokens']!r}"
    assert is_int(data["total_steps"]) and data["total_steps"] == len(CASUAL_PATH), data
    assert is_int(data["created_at"]) and is_int(data["finished_at"]), data


def test_streaming_run_reads_as_a_dify_event_stream(stack: Stack) -> None:
    report = drive(stack, "greeting", "streaming")
    ran_through(report)
    # A blocking run of the same inputs, whose token count the stream's must match.
    blocking = drive(stack, "greeting", "blocking")
    ran_through(blocking)
    run = report["run"]
    assert run["status"] == 200
    assert run["headers"]["content-type"].startswith("text/event-stream"), run["headers"]
    events = run["events"]
    check_envelopes(run)
    task_id, run_id = run["headers"]["x-task-id"], run["headers"]["x-workflow-run-id"]
    assert task_id and run_id, f"the ids are not in the response headers: {run['headers']}"
    assert {event["task_id"] for event in events} == {task_id}
    assert {event["workflow_run_id"] for event in events} == {run_id}
    assert events[1]["event"] == "node_started", names(events)[:5]
    assert events[-1]["event"] == "workflow_finished", names(events)[-5:]
    assert names(events).count("workflow_finished") == 1
    assert run["ended_by"] == "eof", "the server should end the stream after workflow_finished"
    check_workflow_started(events[0]["data"], run_id, report["user"], "initial")

    started, finished = of(events, "node_started"), of(events, "node_finished")
    for data in started:
        missing = lacks(data, NODE_STARTED_KEYS)
        assert not missing, f"node_started of {data.get('node_id')} lacks {missing}: {data}"
    for data in finished:
        missing = lacks(data, NODE_FINISHED_KEYS)
        assert not missing, f"node_finished of {data.get('node_id')} lacks {missing}: {data}"
        assert data["status"] == "succeeded", data
    # The path is a line, so each node came from the one before it, and the start node from nowhere.
    predecessors = list(zip(CASUAL_PATH, [None, *CASUAL_PATH[:-1]], strict=True))
    assert [(data["node_id"], data["predecessor_node_id"]) for data in started] == predecessors
    assert [(data["node_id"], data["predecessor_node_id"]) for data in finished] == predecessors
    assert [data["id"] for data in started] == [data["id"] for data in finished]

    chunks = of(events, "text_chunk")
    assert chunks, "no text_chunk"
    assert all(chunk["from_variable_selector"] == ["draft", "text"] for chunk in chunks), chunks[0]
    assert "".join(chunk["text"] for chunk in chunks) == GREETING_TEXT

    final = events[-1]["data"]
    check_workflow_finished(final, "succeeded")
    assert final["id"] == run_id and final["outputs"] == {"greeting": GREETING_TEXT}
    assert final["total_tokens"] > 0
    assert final["total_tokens"] == blocking["body"]["data"]["total_tokens"], "same inputs, same token count"
    llm = next(data for data in finished if data["node_type"] == "llm")
    metadata = llm["execution_metadata"]
    assert isinstance(metadata, dict) and set(metadata) == LLM_METADATA_KEYS, metadata
    assert metadata["total_tokens"] == final["total_tokens"], "the run's tokens are its one model's"
    assert all(data["execution_metadata"] is None for data in finished if data["node_type"] != "llm")


def test_stop_through_the_sdk_ends_the_run_stopped(stack: Stack) -> None:
    report = drive(stack, "slow", "stop")
    ran_through(report)
    events = report["run"]["events"]
    check_envelopes(report["run"])
    assert report["stop"] is not None, f"no text_chunk to stop after: {names(events)}"
    assert report["stop"]["status"] == 200 and report["stop"]["body"] == {"result": "success"}, report["stop"]
    assert events[-1]["event"] == "workflow_finished", names(events)[-5:]
    check_workflow_finished(events[-1]["data"], "stopped")
    # 300 words take seconds; the stop came after the first, so the text must have been cut short.
    assert len(of(events, "text_chunk")) < 300


def test_human_input_form_pauses_and_resumes_the_run(stack: Stack) -> None:
    report = drive(stack, "greeting", "human_input")
    if "run" not in report:
        ran_through(report)
    run = report["run"]
    events = run["events"]
    check_envelopes(run)
    assert names(events)[-2:] == ["human_input_required", "workflow_paused"], names(events)[-5:]
    assert run["ended_by"] == "eof", "the stream should end when the run pauses"
    run_id = events[0]["workflow_run_id"]
    check_workflow_started(events[0]["data"], run_id, report["user"], "initial")
    required = events[-2]["data"]
    check_human_input_required(required)
    paused = events[-1]["data"]
    missing = lacks(paused, WORKFLOW_PAUSED_KEYS)
    assert not missing, f"workflow_paused lacks {missing}: {paused}"
    assert paused["status"] == "paused" and paused["paused_nodes"] == ["approve"], paused
    assert [reason.get("TYPE") for reason in paused["reasons"]] == ["human_input_required"], paused["reasons"]
    assert paused["reasons"][0].get("form_token") == required["form_token"], paused["reasons"]
    ran_through(report)

    form = report["form"]
    assert form["status"] == 200, form
    missing = lacks(form["body"], FORM_KEYS)
    assert not missing, f"the form lacks {missing}: {form['body']}"
    assert [action.get("id") for action in form["body"]["user_actions"]] == ["submit"], form["body"]
    assert form["body"]["expiration_time"] == required["expiration_time"]
    assert report["submit"] == {"status": 200, "body": {}}
    again = report["submit_again"]
    assert again["status"] == 412 and again["body"].get("code") == "human_input_form_submitted", again

    replay = report["events"]
    assert replay["status"] == 200 and replay["headers"]["content-type"].startswith("text/event-stream"), replay
    resumed = replay["events"]
    check_envelopes(replay)
    assert {event["workflow_run_id"] for event in resumed} == {run_id}
    assert replay["ended_by"] == "workflow_finished", f"the event stream ended before the run: {names(resumed)}"
    reasons = [data.get("reason") for data in of(resumed, "workflow_started")]
    assert reasons == ["initial", "resumption"], reasons
    filled = of(resumed, "human_input_form_filled")
    assert len(filled) == 1 and filled[0]["node_id"] == "approve", filled
    assert filled[0]["action_id"] == report["submitted_action"] == "submit", filled
    approve = [data for data in of(resumed, "node_finished") if data["node_id"] == "approve"]
    assert len(approve) == 1 and approve[0]["outputs"].get("approved") == "true", approve
    final = resumed[-1]["data"]
    check_workflow_finished(final, "succeeded")
    assert final["id"] == run_id
    assert str(final["outputs"].get("greeting", "")).startswith(GREETING_TEXT), final["outputs"]


def test_a_typed_python_client_reads_details_and_stops_runs(stack: Stack) -> None:
    """``dify-oapi2``, a typed Python client written against Dify's reference, for detail and stop.

    (Its run request nests ``inputs`` in another ``inputs`` object, which no Dify server accepts either,
    so runs are started here with a plain request; the Node SDK above covers the run itself.)
    """
    from dify_oapi.api.workflow.v1.model.get_workflow_run_detail_request import GetWorkflowRunDetailRequest
    from dify_oapi.api.workflow.v1.model.stop_workflow_request import StopWorkflowRequest
    from dify_oapi.api.workflow.v1.model.stop_workflow_request_body import StopWorkflowRequestBody
    from dify_oapi.client import Client
    from dify_oapi.core.model.request_option import RequestOption

    client = Client.builder().domain(stack.served.urls[0]).build()
    key, user = stack.keys["slow"], f"py-{uuid.uuid4().hex[:8]}"
    option = RequestOption.builder().api_key(key).build()
    started = requests.post(
        f"{stack.base_url}/workflows/run",
        json={"inputs": {"name": "Ada"}, "user": user, "response_mode": "async"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).json()
    stop_request = (
        StopWorkflowRequest.builder()
        .task_id(started["task_id"])
        .request_body(StopWorkflowRequestBody.builder().user(user).build())
        .build()
    )
    assert client.workflow.v1.workflow.stop(stop_request, option).result == "success"
    detail_request = GetWorkflowRunDetailRequest.builder().workflow_run_id(started["workflow_run_id"]).build()
    deadline = time.monotonic() + 30
    while (detail := client.workflow.v1.workflow.detail(detail_request, option)).status in ("running", None):
        assert time.monotonic() < deadline, f"the run never stopped: {detail}"
        time.sleep(0.05)
    assert detail.status == "stopped" and detail.error == "stopped by user"
    assert detail.id == started["workflow_run_id"] and isinstance(detail.total_tokens, int)
    assert isinstance(detail.elapsed_time, float) and isinstance(detail.created_at, int)
    assert isinstance(detail.finished_at, int) and detail.inputs == {"name": "Ada"}
    client.close()


def test_dify_s_typed_python_client_makes_every_workflow_call(stack: Stack) -> None:
    """``dify-client-python`` (Dify's typed client, unchanged), through every workflow call it offers: a
    blocking and a streaming run (one that pauses for a form too), a stop (by another end user, and of
    an unknown task), a file upload, the speech calls, and the same run and stop from its async client.
    Each answer is parsed by the client's own models; a field they would choke on fails here."""
    import asyncio

    from dify_client import AsyncClient, Client, errors, models
    from dify_client import _clientx as clientx

    client = Client(api_key=stack.keys["greeting"], api_base=stack.base_url)
    user = f"typed-{uuid.uuid4().hex[:8]}"

    def run(mode: models.ResponseMode, **inputs: str) -> Any:
        request = models.WorkflowsRunRequest(inputs={"name": "Ada", **inputs}, response_mode=mode, user=user)
        return client.run_workflows(request)

    blocking = run(models.ResponseMode.BLOCKING)
    assert isinstance(blocking, models.WorkflowsRunResponse) and blocking.data.status == "succeeded"
    assert blocking.data.outputs == {"greeting": GREETING_TEXT} and blocking.data.created_by["user"] == user
    assert blocking.data.total_tokens and blocking.data.total_tokens > 0

    streamed = list(run(models.ResponseMode.STREAMING))
    kinds = [str(event.event) for event in streamed]
    assert kinds[0] == "workflow_started" and kinds[-1] == "workflow_finished", kinds
    # The client hands most workflow events' data over as a dict (its union ends in a Dict member);
    # each is parsed here with the client's own model of its kind.
    typed = {
        "workflow_started": models.WorkflowStartedData,
        "node_started": models.NodeStartedData,
        "node_finished": models.NodeFinishedData,
        "workflow_finished": models.WorkflowFinishedData,
    }
    parsed = [
        typed[kind].model_validate(event.data, from_attributes=True)
        for kind, event in zip(kinds, streamed, strict=True)
        if kind in typed
    ]
    finished_nodes = [data for data in parsed if isinstance(data, models.NodeFinishedData)]
    llm = next(data for data in finished_nodes if data.node_type == "llm")
    assert llm.execution_metadata is not None and llm.execution_metadata.total_tokens == blocking.data.total_tokens
    assert llm.outputs_truncated is False and llm.inputs_truncated is False
    text = "".join(event.data.text for event in streamed if isinstance(event, models.TextChunkStreamResponse))
    assert text == GREETING_TEXT
    assert isinstance(parsed[-1], models.WorkflowFinishedData) and parsed[-1].status == "succeeded"

    paused = list(run(models.ResponseMode.STREAMING, mood="formal"))
    assert [str(event.event) for event in paused][-2:] == ["human_input_required", "workflow_paused"]
    form = paused[-2].data
    assert isinstance(form, dict) and form["inputs"][0]["type"] == "select" and form["approval_channels"] == []
    assert paused[-1].data["reasons"][0]["TYPE"] == "human_input_required"

    slow = Client(api_key=stack.keys["slow"], api_base=stack.base_url)
    started = requests.post(
        f"{stack.base_url}/workflows/run",
        json={"inputs": {"name": "Ada"}, "user": user, "response_mode": "async"},
        headers={"Authorization": f"Bearer {stack.keys['slow']}"},
        timeout=30,
    ).json()
    # Any end user of the app may stop its task; an unknown task is a success too.
    assert slow.stop_workflows(started["task_id"], models.StopRequest(user="someone else")).result == "success"
    assert slow.stop_workflows(str(uuid.uuid4()), models.StopRequest(user=user)).result == "success"
    detail = f"{stack.base_url}/workflows/run/{started['workflow_run_id']}"
    headers = {"Authorization": f"Bearer {stack.keys['slow']}"}
    deadline = time.monotonic() + 30
    while (status := requests.get(detail, headers=headers, timeout=30).json()["status"]) == "running":
        assert time.monotonic() < deadline, "the run never stopped"
        time.sleep(0.05)
    assert status == "stopped"

    uploaded = client.upload_files(("notes.txt", b"hello", "text/plain"), models.UploadFileRequest(user=user))
    assert isinstance(uploaded, models.UploadFileResponse) and (uploaded.name, uploaded.size) == ("notes.txt", 5)
    with pytest.raises(errors.DifyAPIError) as speech:
        client.audio_to_text(("a.mp3", b"ID3", "audio/mpeg"), models.AudioToTextRequest(user=user))
    assert (speech.value.status, speech.value.code) == (400, "speech_to_text_disabled")
    with pytest.raises(errors.DifyInvalidParam):
        client.text_to_audio(models.TextToAudioRequest(text="hi", user=user))

    async def async_calls() -> tuple[Any, Any]:
        async_client = AsyncClient(api_key=stack.keys["greeting"], api_base=stack.base_url)
        request = models.WorkflowsRunRequest(
            inputs={"name": "Ada"}, response_mode=models.ResponseMode.BLOCKING, user=user
        )
        try:
            answer = await async_client.arun_workflows(request)
            stop = await async_client.astop_workflows(answer.task_id, models.StopRequest(user=user))
        finally:
            await clientx._async_httpx_client.aclose()  # bound to this event loop, which ends here
        return answer, stop

    try:
        answer, stop = asyncio.run(async_calls())
    finally:
        clientx._httpx_client.close()  # the client's module-wide pool: no socket outlives the test
    assert answer.data.status == "succeeded" and stop.result == "success"


def test_the_node_sdk_reads_parameters_uploads_and_is_told_a_workflow_app_is_no_chat_app(stack: Stack) -> None:
    report = drive(stack, "greeting", "app")
    ran_through(report)
    parameters = report["parameters"]
    assert parameters["status"] == 200, parameters
    assert [next(iter(item)) for item in parameters["body"]["user_input_form"]] == ["text-input", "text-input"]
    assert [item["text-input"]["variable"] for item in parameters["body"]["user_input_form"]] == ["name", "mood"]
    upload = report["upload"]
    assert upload["status"] == 201, upload
    assert (upload["body"]["name"], upload["body"]["size"], upload["body"]["mime_type"]) == (
        "node.txt",
        15,
        "text/plain",
    )
    assert report["chat"]["status"] == 400 and report["chat"]["body"]["code"] == "not_chat_app", report["chat"]
