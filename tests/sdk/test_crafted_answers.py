"""The client's decisions against crafted answers (no server): the exact requests it sends when a
start is cut, when a stream drops before its first event, when it attaches to a run, and how it
reads the API's shapes. The same behaviour against the real stack is in the other modules.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from durable_workflow_client import (
    AsyncClient,
    Client,
    ConnectionLostError,
    FormExpiredError,
    FormSubmittedError,
    HumanInputFormFilled,
    HumanInputFormTimeout,
    HumanInputRequired,
    IdempotencyKeyReusedError,
    InvalidFormDataError,
    RetryPolicy,
    RunDetail,
    ServiceUnavailableError,
    WebClient,
    WorkflowFinished,
    WorkflowPaused,
    WorkflowStarted,
    parse_event,
)

QUICK = RetryPolicy(initial_delay=0.001, max_delay=0.01, max_attempts=5)
IDS = {"X-Task-Id": "t1", "X-Workflow-Run-Id": "r1"}
EVENT_STREAM = {"Content-Type": "text/event-stream"}

FORM = {
    "form_id": "f1",
    "node_id": "approve",
    "node_title": "Approve the greeting",
    "form_content": "Approve? {{#$output.approved#}}",
    "inputs": [
        {"type": "boolean", "output_variable_name": "approved", "label": "approved", "required": True},
        {
            "type": "text-input",
            "output_variable_name": "note",
            "label": "note",
            "required": False,
            "default": {"type": "constant", "value": "ok"},
        },
    ],
    "actions": [{"id": "submit", "title": "Submit", "button_style": "primary"}],
    "display_in_ui": True,
    "form_token": "tok-1",
    "resolved_default_values": {"note": "ok"},
    "expiration_time": 1_900_000_000,
}


def event(name: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    body = json.dumps({"event": name, "task_id": "t1", "workflow_run_id": "r1", "data": data})
    return (f"id: {event_id}\n" if event_id else "").encode() + f"data: {body}\n\n".encode()


PING = b"event: ping\n\n"
STARTED = event("workflow_started", {"id": "r1", "inputs": {}, "created_at": 1, "reason": "initial"}, "e1")
FINISHED = event("workflow_finished", {"id": "r1", "status": "succeeded", "outputs": {}, "total_tokens": 7}, "e2")


class CutStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that sends ``chunks`` and then breaks as a dropped connection does."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.ReadError("the connection was cut")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        raise httpx.ReadError("the connection was cut")


def sse(*chunks: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    """A whole event stream."""
    return httpx.Response(200, headers={**EVENT_STREAM, **(headers or {})}, content=b"".join(chunks))


def cut(*chunks: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    """An event stream that breaks after ``chunks``."""
    return httpx.Response(200, headers={**EVENT_STREAM, **(headers or {})}, stream=CutStream(*chunks))


Handler = Callable[[httpx.Request], httpx.Response]


def recording(handler: Handler, sent: list[httpx.Request]) -> httpx.Client:
    """An HTTP client whose requests ``handler`` answers and ``sent`` lists."""

    def record(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return handler(request)

    return httpx.Client(transport=httpx.MockTransport(record))


def client_with(handler: Handler, sent: list[httpx.Request]) -> Client:
    return Client("http://api.test", "app-k", retry=QUICK, http_client=recording(handler, sent))


def test_a_drop_before_the_first_event_resumes_from_the_start_by_the_ids_of_the_headers() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return cut(PING, headers=IDS)
        return sse(PING, STARTED, FINISHED)

    with client_with(handler, sent) as client:
        stream = client.run({"name": "Ada"}, "u1")
        events = list(stream)
    assert [e.event for e in events] == ["workflow_started", "workflow_finished"]
    assert (stream.task_id, stream.workflow_run_id, stream.reconnects) == ("t1", "r1", 1)
    _, resume = sent
    assert resume.method == "GET" and resume.url.path == "/v1/workflow/r1/events"
    assert dict(resume.url.params) == {"user": "u1", "include_state_snapshot": "true"}
    assert "last-event-id" not in resume.headers


def test_a_drop_after_an_event_resumes_strictly_after_it() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return cut(PING, STARTED, headers=IDS)
        return sse(FINISHED)

    with client_with(handler, sent) as client:
        assert [e.id for e in client.run({}, "u1")] == ["e1", "e2"]
    resume = sent[1]
    assert resume.headers["Last-Event-ID"] == "e1" and dict(resume.url.params) == {"user": "u1"}


def test_a_start_cut_before_its_answer_is_sent_again_with_the_same_key() -> None:
    sent: list[httpx.Request] = []
    failures = iter([httpx.RemoteProtocolError("no response"), httpx.ReadTimeout("no headers")])

    def handler(request: httpx.Request) -> httpx.Response:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return sse(PING, STARTED, FINISHED, headers={**IDS, "Idempotent-Replayed": "true"})

    notes: list[object] = []
    with client_with(handler, sent) as client:
        client.on_reconnect = notes.append
        stream = client.run({"name": "Ada"}, "u1")
        assert [e.event for e in stream] == ["workflow_started", "workflow_finished"]
    keys = {request.headers["Idempotency-Key"] for request in sent}
    assert [request.method for request in sent] == ["POST"] * 3 and keys == {stream.idempotency_key}
    assert uuid.UUID(str(stream.idempotency_key)).version == 4
    assert stream.replayed and len(notes) == 2


def test_without_a_key_a_start_that_may_have_arrived_is_not_sent_again() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("no response")

    with client_with(handler, sent) as client:
        with pytest.raises(ConnectionLostError, match="may have taken effect"):
            list(client.run({}, "u1", idempotency_key=False))
        with pytest.raises(ConnectionLostError):
            client.start({}, "u1", idempotency_key=False)
    assert len(sent) == 2 and all("idempotency-key" not in request.headers for request in sent)


def test_a_keyed_start_answered_500_is_sent_again_an_unkeyed_one_is_not() -> None:
    sent: list[httpx.Request] = []
    answers = iter([httpx.Response(500, json={"code": "internal_error"})])

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers, None) or httpx.Response(202, json={"task_id": "t1", "workflow_run_id": "r1"})

    with client_with(handler, sent) as client:
        assert client.start({}, "u1").workflow_run_id == "r1"
        answers = iter([httpx.Response(500, json={"code": "internal_error"})])
        with pytest.raises(ServiceUnavailableError):
            client.start({}, "u1", idempotency_key=False)
    assert len(sent) == 3
    assert sent[0].headers["Idempotency-Key"] == sent[1].headers["Idempotency-Key"]


def test_every_start_has_a_fresh_key_unless_the_caller_gives_one() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["response_mode"] == "blocking":
            data = {"id": "r1", "status": "succeeded", "outputs": {}, "total_tokens": 3, "total_steps": 2}
            return httpx.Response(200, json={"task_id": "t1", "workflow_run_id": "r1", "data": data})
        replayed = {"Idempotent-Replayed": "true"} if request.headers["Idempotency-Key"] == "mine" else {}
        return httpx.Response(202, json={"task_id": "t1", "workflow_run_id": "r1"}, headers=replayed)

    with client_with(handler, sent) as client:
        first, second = client.start({}, "u1"), client.start({}, "u1")
        mine = client.start({}, "u1", idempotency_key="mine")
        outcome = client.run({}, "u1", stream=False)
        for bad in ("", "a b", "é", "x" * 256, "tab\there"):
            with pytest.raises(ValueError, match="Idempotency-Key"):
                client.start({}, "u1", idempotency_key=bad)
    keys = [request.headers["Idempotency-Key"] for request in sent]
    assert len(set(keys)) == 4 and keys[2] == "mine"
    assert not first.replayed and not second.replayed and mine.replayed
    assert outcome.run.total_tokens == 3 and not outcome.replayed


def test_following_a_run_asks_for_its_beginning_unless_told_otherwise() -> None:
    sent: list[httpx.Request] = []
    bodies = iter([(PING,), (STARTED,)])

    def handler(request: httpx.Request) -> httpx.Response:
        body = next(bodies, None)
        return cut(*body) if body is not None else sse(FINISHED)

    with client_with(handler, sent) as client:
        events = list(client.follow("r1", "u1"))
        list(client.follow("r1", "u1", from_start=False))
        list(client.follow("t1", "u1", after="e1"))
    assert [e.id for e in events] == ["e1", "e2"]
    params = [dict(request.url.params) for request in sent]
    snapshot = {"user": "u1", "include_state_snapshot": "true"}
    # From the start; cut before any event: again from the start; cut after e1: strictly after it.
    assert params[:3] == [snapshot, snapshot, {"user": "u1"}] and sent[2].headers["Last-Event-ID"] == "e1"
    # From the tail; after a token.
    assert params[3:] == [{"user": "u1"}, {"user": "u1"}] and sent[4].headers["Last-Event-ID"] == "e1"
    # Reconnects name the run by its workflow run id once it is known.
    assert {request.url.path for request in sent[:4]} == {"/v1/workflow/r1/events"}
    assert sent[4].url.path == "/v1/workflow/t1/events"


def test_submitting_a_form_by_its_token_uses_its_first_action_by_default() -> None:
    sent: list[httpx.Request] = []
    form = {k: FORM[k] for k in ("form_content", "inputs", "resolved_default_values", "expiration_time")}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/passport"):
            return httpx.Response(200, json={"access_token": "pass", "end_user": "web-1"})
        if request.method == "GET":
            return httpx.Response(200, json={**form, "user_actions": FORM["actions"]})
        return httpx.Response(200, json={})

    with client_with(handler, sent) as client:
        shown = client.get_form("tok-1")
        client.submit_form("tok-1", "u1", {"approved": True})
        client.submit_form("tok-1", "u1", {"approved": False}, action="reject")
    with WebClient("http://api.test", "site", http_client=recording(handler, sent)) as web:
        web.submit_form("tok/2", {"approved": True}, action="submit")
    assert [field.output_variable_name for field in shown.inputs] == ["approved", "note"]
    assert shown.inputs[1].default_value == "ok" and not shown.inputs[1].required
    assert [action.id for action in shown.user_actions] == ["submit"] and shown.expiration_time == 1_900_000_000
    routes = [(request.method, request.url.raw_path.decode()) for request in sent]
    assert routes == [
        ("GET", "/v1/form/human_input/tok-1"),
        ("GET", "/v1/form/human_input/tok-1"),
        ("POST", "/v1/form/human_input/tok-1"),
        ("POST", "/v1/form/human_input/tok-1"),
        ("GET", "/api/passport"),
        ("POST", "/api/form/human_input/tok%2F2"),
    ]
    bodies = [json.loads(request.content) for request in sent if request.method == "POST"]
    assert bodies == [
        {"inputs": {"approved": True}, "action": "submit", "user": "u1"},
        {"inputs": {"approved": False}, "action": "reject", "user": "u1"},
        {"inputs": {"approved": True}, "action": "submit"},
    ]
    assert sent[-1].headers["Authorization"] == "Bearer pass"


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (412, "human_input_form_submitted", FormSubmittedError),
        (412, "human_input_form_expired", FormExpiredError),
        (400, "invalid_form_data", InvalidFormDataError),
        (422, "idempotency_key_reused", IdempotencyKeyReusedError),
    ],
)
def test_the_new_error_codes_are_typed(status: int, code: str, error: type[Exception]) -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"code": code, "message": "no", "status": status})

    with client_with(handler, sent) as client, pytest.raises(error):
        client.submit_form("tok-1", "u1", {}, action="submit")
    assert len(sent) == 1, "a 4xx is never sent again"


def test_the_human_input_events_and_a_resumption_are_typed() -> None:
    required = parse_event({"event": "human_input_required", "data": FORM}, "e3")
    assert isinstance(required, HumanInputRequired)
    assert (required.form_token, required.node_title, required.expiration_time) == (
        "tok-1",
        "Approve the greeting",
        1_900_000_000,
    )
    assert [(f.output_variable_name, f.type, f.required) for f in required.inputs] == [
        ("approved", "boolean", True),
        ("note", "text-input", False),
    ]
    assert required.actions[0].button_style == "primary" and required.resolved_default_values == {"note": "ok"}

    paused_data = {
        "workflow_run_id": "r1",
        "paused_nodes": ["approve"],
        "outputs": {},
        "reasons": [{**FORM, "type": "human_input_required"}],
        "status": "paused",
        "created_at": 5,
        "elapsed_time": 0.5,
        "total_tokens": 12,
        "total_steps": 4,
    }
    paused = parse_event({"event": "workflow_paused", "data": paused_data}, "e4")
    assert isinstance(paused, WorkflowPaused)
    assert paused.paused_nodes == ["approve"] and paused.total_tokens == 12 and paused.total_steps == 4
    (reason,) = paused.reasons
    assert reason.type == "human_input_required" and reason.form_token == "tok-1" and reason.inputs == required.inputs

    resumed = parse_event({"event": "workflow_started", "data": {"inputs": {}, "reason": "resumption"}}, "e5")
    assert isinstance(resumed, WorkflowStarted) and resumed.reason == "resumption"
    filled_data = {"node_id": "approve", "node_title": "A", "rendered_content": "Approve? true", "action_id": "submit"}
    filled = parse_event({"event": "human_input_form_filled", "data": {**filled_data, "action_text": "Submit"}}, None)
    assert isinstance(filled, HumanInputFormFilled) and filled.action_text == "Submit"
    timeout = parse_event(
        {"event": "human_input_form_timeout", "data": {"node_id": "approve", "expiration_time": 9}}, None
    )
    assert isinstance(timeout, HumanInputFormTimeout) and timeout.expiration_time == 9
    finished = parse_event({"event": "workflow_finished", "data": {"status": "failed", "total_tokens": 30}}, None)
    assert isinstance(finished, WorkflowFinished) and finished.total_tokens == 30

    blocking = {"id": "r1", "status": "paused", "total_tokens": 12, "finished_at": None}
    detail = RunDetail.from_json({**blocking, "paused_nodes": ["approve"], "reasons": paused_data["reasons"]})
    assert detail.total_tokens == 12 and detail.paused_nodes == ["approve"] and detail.reasons == paused.reasons


def test_a_second_workflow_started_is_one_more_event() -> None:
    sent: list[httpx.Request] = []
    paused = event("workflow_paused", {"status": "paused", "paused_nodes": ["approve"]}, "p")
    resumed = event("workflow_started", {"id": "r1", "inputs": {}, "reason": "resumption"}, "s2")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return sse(PING, STARTED, paused, headers=IDS)
        return sse(PING, resumed, FINISHED)

    with client_with(handler, sent) as client:
        stream = client.run({}, "u1", continue_on_pause=True)
        events = list(stream)
    assert [e.event for e in events] == ["workflow_started", "workflow_paused", "workflow_started", "workflow_finished"]
    assert stream.reconnects == 0 and sent[1].headers["Last-Event-ID"] == "p"


def test_the_asyncio_client_learns_the_ids_from_headers_and_resends_a_cut_start() -> None:
    sent: list[httpx.Request] = []
    failures = iter([httpx.RemoteProtocolError("no response")])

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.method == "POST":
            failure = next(failures, None)
            if failure is not None:
                raise failure
            return cut(PING, headers=IDS)
        return sse(PING, STARTED, FINISHED)

    async def main() -> tuple[list[str], str | None]:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with AsyncClient("http://api.test", "app-k", retry=QUICK, http_client=http) as client:
            stream = client.run({}, "u1")
            names = [e.event async for e in stream]
            await http.aclose()
            return names, stream.workflow_run_id

    names, run_id = asyncio.run(main())
    assert names == ["workflow_started", "workflow_finished"] and run_id == "r1"
    assert [request.method for request in sent] == ["POST", "POST", "GET"]
    assert sent[0].headers["Idempotency-Key"] == sent[1].headers["Idempotency-Key"]
    assert dict(sent[2].url.params) == {"user": "u1", "include_state_snapshot": "true"}
