"""A bounded property-based run over the workflow operations of Dify's published spec.

Requests are generated from the spec itself: each operation's request-body schema (hypothesis-jsonschema)
and its path and query parameters, mixed with ids that exist (a finished run, a paused run and its
form, a running task) and with values that do not. Every answer must be one the spec allows: never a
server error; a success that conforms to the operation's response schema (each event of a stream to
its event's schema); an error as ``{"code", "message", "status"}`` with the status it says. A few
hundred requests in all (``EXAMPLES`` per operation), so that ``make test`` stays quick.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.processes import running_worker
from tests.app.conftest import AppHarness
from tests.app.dify_spec import event_schema, response_schema, spec, spec_errors

#: Generated requests per operation.
EXAMPLES = 50
USER = "fuzz"
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_ALPHABET = st.characters(codec="ascii", categories=("L", "N"), include_characters="-_.~")


@dataclasses.dataclass
class Known:
    """What exists on the server, for requests that name it."""

    key: str
    finished_run: str
    finished_task: str
    paused_run: str
    paused_task: str
    form_token: str
    #: Another paused run's task, for the stops (a stopped run's form would be answered 412 only).
    stoppable_task: str


@pytest.fixture(scope="module")
def known(make_fuzz_harness: AppHarness) -> Known:
    harness = make_fuzz_harness
    key = harness.create_app("greeting")["api_key"]
    finished = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Ada"}, "user": USER}).json
    paused = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Bo", "mood": "formal"}, "user": USER}).json
    assert (finished["data"]["status"], paused["data"]["status"]) == ("succeeded", "paused")
    token = paused["data"]["reasons"][0]["form_token"]
    stoppable = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Di", "mood": "formal"}, "user": USER}).json
    return Known(
        key,
        finished["workflow_run_id"],
        finished["task_id"],
        paused["workflow_run_id"],
        paused["task_id"],
        token,
        stoppable["task_id"],
    )


@pytest.fixture(scope="module")
def make_fuzz_harness(module_env: dict[str, str]) -> Iterator[AppHarness]:
    """The stack, with event streams that end after a second without events (a stream left open on a
    pause must not hold a request for the default five minutes)."""
    env = {**module_env, "SSE_IDLE_TIMEOUT": "1", "SSE_PING_INTERVAL": "0.5"}
    with running_worker(env, pathlib.Path(env["VAR_DIR"]) / "fuzz-worker.log") as worker:
        harness = AppHarness(env, worker)
        try:
            yield harness
        finally:
            harness.close()


def _body_schema(path: str, method: str) -> dict[str, Any]:
    body = spec()["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    if "$ref" in body:
        body = spec()["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    return _inline(body)


def _inline(node: Any) -> Any:
    """A schema with its ``$ref``\\s replaced by what they name (hypothesis-jsonschema needs no registry)."""
    if isinstance(node, list):
        return [_inline(item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline(spec()["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]])
    return {key: _inline(value) for key, value in node.items() if key not in ("description", "example", "examples")}


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of a request schema of the spec (the few JSON Schema keywords its request bodies use): every
    required member, any optional one, and values of each declared type or enum."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            return st.one_of([from_schema(option) for option in schema[combinator]])
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        required = [name for name in schema.get("required", []) if name in properties]
        optional = {name: from_schema(value) for name, value in properties.items() if name not in required}
        extra = st.dictionaries(_TEXT, _TEXT, max_size=2) if schema.get("additionalProperties") else st.just({})
        return st.builds(
            lambda fixed, chosen, more: {**more, **fixed, **chosen},
            st.fixed_dictionaries({name: from_schema(properties[name]) for name in required}),
            st.fixed_dictionaries({}, optional=optional),
            extra,
        )
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), max_size=3)
    if kind == "integer":
        return st.integers(-(2**31), 2**31)
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return _TEXT
    return st.one_of(_TEXT, st.integers(), st.booleans(), st.none())


def _segment(known_ids: list[str]) -> st.SearchStrategy[str]:
    """A path segment: an id that exists, or text that is not one."""
    return st.one_of(st.sampled_from(known_ids), st.text(_ALPHABET, min_size=1, max_size=40))


def _users() -> st.SearchStrategy[str | None]:
    return st.one_of(st.just(USER), _TEXT, st.none())


def _run_body() -> st.SearchStrategy[Any]:
    schema = _body_schema("/workflows/run", "post")
    generated = from_schema(schema).map(lambda body: {**body, "inputs": {"name": "Cy", **body["inputs"]}})
    return st.one_of(generated, from_schema(schema), st.dictionaries(_TEXT, _TEXT, max_size=3))


@dataclasses.dataclass(frozen=True)
class Call:
    operation: tuple[str, str]  # (method, spec path)
    path: str
    body: Any = None


def _query(**params: str | None) -> str:
    present = {key: value for key, value in params.items() if value is not None}
    return "?" + urllib.parse.urlencode(present) if present else ""


def calls(known: Known) -> dict[str, st.SearchStrategy[Call]]:
    runs = [known.finished_run, known.paused_run]
    tasks = [known.finished_task, known.paused_task]
    booleans = st.sampled_from([None, "true", "false"])
    return {
        "run": _run_body().map(lambda body: Call(("post", "/workflows/run"), "/v1/workflows/run", body)),
        "detail": st.builds(
            lambda run, user: Call(
                ("get", "/workflows/run/{workflow_run_id}"),
                f"/v1/workflows/run/{urllib.parse.quote(run)}" + _query(user=user),
            ),
            _segment(runs),
            _users(),
        ),
        "stop": st.builds(
            lambda task, body: Call(
                ("post", "/workflows/tasks/{task_id}/stop"),
                f"/v1/workflows/tasks/{urllib.parse.quote(task)}/stop",
                body,
            ),
            _segment([known.finished_task, known.stoppable_task]),
            st.one_of(from_schema(_body_schema("/workflows/tasks/{task_id}/stop", "post")), st.none()),
        ),
        "form": st.builds(
            lambda token, body: Call(
                ("post" if body is not None else "get", "/form/human_input/{form_token}"),
                f"/v1/form/human_input/{urllib.parse.quote(token)}",
                body,
            ),
            _segment([known.form_token]),
            st.one_of(st.none(), from_schema(_body_schema("/form/human_input/{form_token}", "post"))),
        ),
        "events": st.builds(
            lambda run, user, snapshot, pause: Call(
                ("get", "/workflow/{workflow_run_id}/events"),
                f"/v1/workflow/{urllib.parse.quote(run)}/events"
                + _query(user=user, include_state_snapshot=snapshot, continue_on_pause=pause),
            ),
            _segment(runs + tasks),
            _users(),
            booleans,
            booleans,
        ),
    }


#: Errors any operation may answer: a malformed request or body (400), a key (401), an unknown id (404),
#: a body over the limit (413), and the ones each operation documents.
COMMON_ERRORS = {400, 401, 404, 413}


def documented_statuses(method: str, path: str) -> set[int]:
    return {int(status) for status in spec()["paths"][path][method]["responses"]}


def check(harness: AppHarness, known: Known, call: Call) -> int:
    """Send ``call`` and hold its answer to the spec; its status."""
    headers = {"Authorization": f"Bearer {known.key}"}
    method, spec_path = call.operation
    if method == "get":
        response = harness.client.get(call.path, headers=headers)
    else:
        response = harness.client.post(call.path, json=call.body, headers=headers)
    what = f"{method.upper()} {call.path} {json.dumps(call.body, default=str)[:300]}"
    try:
        status = response.status_code
        assert status < 500, f"{what}: {status} {response.get_data(as_text=True)[:500]}"
        if status >= 400:
            body = response.json
            assert isinstance(body, dict) and body.get("status") == status, f"{what}: {body}"
            assert isinstance(body.get("code"), str) and isinstance(body.get("message"), str), f"{what}: {body}"
            assert status in documented_statuses(method, spec_path) | COMMON_ERRORS, f"{what}: {status} {body}"
            return status
        if response.mimetype == "text/event-stream":
            for line in response.get_data(as_text=True).splitlines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event.get("event") not in (None, "error", "ping"):
                        errors = spec_errors(event_schema(event["event"]), event)
                        assert not errors, f"{what}: event {event['event']}: {errors}"
            return status
        errors = spec_errors(response_schema(method, spec_path, status), response.json)
        assert not errors, f"{what}: {status}: {errors}"
        return status
    finally:
        response.close()


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("operation", ["run", "detail", "stop", "form", "events"])
def test_generated_requests_get_answers_the_spec_allows(
    make_fuzz_harness: AppHarness, known: Known, operation: str
) -> None:
    statuses: list[int] = []

    @FUZZ
    @given(calls(known)[operation])
    def property_(call: Call) -> None:
        statuses.append(check(make_fuzz_harness, known, call))

    property_()
    # The requests reached the operation both ways: some were taken, some refused.
    assert any(status < 300 for status in statuses) and any(status >= 400 for status in statuses), statuses
