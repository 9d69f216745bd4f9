"""Every kind of event the engine emits, held to Dify's two references: the published spec's schemas
(``tests/app/dify_spec.py``) and, key for key, the fields of Dify's own pydantic models.

Dify's service API sends ``model_dump()`` of its stream models, so every field a model declares, a
defaulted one included, is on Dify's wire, and a typed client parses with those models. The field
lists below are written down from Dify's models (``api/core/app/entities/task_entities.py``, the
human-input entities, graphon's execution-metadata keys); no Dify code is used. An event whose data
lacks a field a Dify client expects, or has one Dify's model does not know, fails here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.workflow import ResumePoint, WorkflowEngine
from tests.app import examples
from tests.app.dify_spec import event_schema, validate_spec
from tests.app.loopback import failing_service

GREETING = examples.greeting()

#: ``StreamResponse`` and its workflow wrapper: what is around every event's data.
ENVELOPE = {"event", "task_id", "workflow_run_id", "data"}
#: ``<Event>StreamResponse.Data`` of each event the engine emits.
DIFY_DATA_FIELDS: dict[str, set[str]] = {
    "workflow_started": {"id", "workflow_id", "inputs", "created_at", "reason"},
    "node_started": {
        "id", "node_id", "node_type", "title", "index", "predecessor_node_id", "inputs", "inputs_truncated",
        "created_at", "extras", "iteration_id", "loop_id", "agent_strategy",
    },
    "text_chunk": {"text", "from_variable_selector"},
    "node_finished": {
        "id", "node_id", "node_type", "title", "index", "predecessor_node_id", "inputs", "inputs_truncated",
        "process_data", "process_data_truncated", "outputs", "outputs_truncated", "status", "error",
        "elapsed_time", "execution_metadata", "created_at", "finished_at", "files", "iteration_id", "loop_id",
    },
    "human_input_required": {
        "form_id", "node_id", "node_title", "form_content", "inputs", "actions", "display_in_ui", "form_token",
        "resolved_default_values", "expiration_time", "approval_channels",
    },
    "workflow_paused": {
        "workflow_run_id", "paused_nodes", "outputs", "reasons", "status", "created_at", "elapsed_time",
        "total_tokens", "total_steps",
    },
    "human_input_form_filled": {
        "node_id", "node_title", "rendered_content", "action_id", "action_text", "submitted_data",
    },
    "human_input_form_timeout": {"node_id", "node_title", "expiration_time"},
    "node_retry": {
        "id", "node_id", "node_type", "title", "index", "predecessor_node_id", "inputs", "inputs_truncated",
        "process_data", "process_data_truncated", "outputs", "outputs_truncated", "status", "error",
        "elapsed_time", "execution_metadata", "created_at", "finished_at", "files", "iteration_id", "loop_id",
        "retry_index",
    },
    "iteration_started": {
        "id", "node_id", "node_type", "title", "created_at", "extras", "metadata", "inputs", "inputs_truncated",
    },
    "iteration_next": {"id", "node_id", "node_type", "title", "index", "created_at", "extras"},
    "iteration_completed": {
        "id", "node_id", "node_type", "title", "outputs", "outputs_truncated", "created_at", "extras", "inputs",
        "inputs_truncated", "status", "error", "elapsed_time", "total_tokens", "execution_metadata", "finished_at",
        "steps",
    },
    "loop_started": {
        "id", "node_id", "node_type", "title", "created_at", "extras", "metadata", "inputs", "inputs_truncated",
    },
    "loop_next": {"id", "node_id", "node_type", "title", "index", "created_at", "pre_loop_output", "extras"},
    "loop_completed": {
        "id", "node_id", "node_type", "title", "outputs", "outputs_truncated", "created_at", "extras", "inputs",
        "inputs_truncated", "status", "error", "elapsed_time", "total_tokens", "execution_metadata", "finished_at",
        "steps",
    },
    "workflow_finished": {
        "id", "workflow_id", "status", "outputs", "error", "elapsed_time", "total_tokens", "total_steps",
        "created_by", "created_at", "finished_at", "exceptions_count", "files",
    },
}  # fmt: skip
#: The form input union (``FormInputConfig``), by ``type``.
DIFY_FORM_INPUT_FIELDS = {
    "paragraph": {"output_variable_name", "type", "default"},
    "select": {"output_variable_name", "type", "option_source"},
    "file": {
        "output_variable_name", "type", "allowed_file_types", "allowed_file_extensions", "allowed_file_upload_methods",
    },
    "file-list": {
        "output_variable_name", "type", "allowed_file_types", "allowed_file_extensions",
        "allowed_file_upload_methods", "number_limits",
    },
}  # fmt: skip
DIFY_SOURCE_FIELDS = {"type", "selector", "value"}  # StringSource, StringListSource
DIFY_ACTION_FIELDS = {"id", "title", "button_style"}  # UserActionConfig
#: A pause reason: the form's fields under Dify's discriminator key.
DIFY_PAUSE_REASON_FIELDS = {"TYPE"} | DIFY_DATA_FIELDS["human_input_required"]
#: ``WorkflowNodeExecutionMetadataKey``: the only keys Dify's model takes in ``execution_metadata``.
DIFY_METADATA_KEYS = {
    "total_tokens", "total_price", "currency", "tool_info", "agent_log", "iteration_id", "iteration_index",
    "loop_id", "loop_index", "parallel_id", "parallel_start_node_id", "parent_parallel_id",
    "parent_parallel_start_node_id", "parallel_mode_run_id", "iteration_duration_map", "loop_duration_map",
    "error_strategy", "loop_variable_map", "datasource_info", "trigger_info", "completed_reason",
}  # fmt: skip


def engine(definition: dict[str, Any], inputs: dict[str, Any], **kwargs: Any) -> WorkflowEngine:
    return WorkflowEngine(
        examples.graph_of(definition),
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs=inputs,
        user="u",
        created_at=time.time(),
        **kwargs,
    )


def all_kinds() -> Iterator[tuple[str, dict[str, Any]]]:
    """One run of every outcome (finished, paused, resumed by a filled form, timed out, failed, stopped) and
    every example: an iteration, a loop, an HTTP request retried against a failing loopback service."""
    formal = {"name": "Ada", "mood": "formal"}
    for event in engine(GREETING, {"name": "Ada"}).run():
        yield "finished", event
    paused = engine(GREETING, formal)
    for event in paused.run():
        yield "paused", event
    assert paused.outcome is not None and paused.outcome.state is not None
    state = json.loads(json.dumps(paused.outcome.state))
    answer = {"kind": "submission", "inputs": {"approved": "true", "note": "ok"}, "action": "submit"}
    for event in engine(GREETING, formal, resume=ResumePoint(state, answer)).run():
        yield "resumed", event
    for event in engine(GREETING, formal, resume=ResumePoint(state, {"kind": "timeout"})).run():
        yield "timed out", event
    failing = examples.script_model(GREETING, error_after_tokens=2, error="the model failed")
    for event in engine(failing, {"name": "Ada"}).run():
        yield "failed", event
    asked: list[int] = []

    def stop_after_some_text() -> str | None:
        asked.append(1)
        return "stopped by user" if len(asked) > 6 else None

    for event in engine(GREETING, {"name": "Ada"}, should_stop=stop_after_some_text).run():
        yield "stopped", event
    for event in engine(examples.example("iteration"), {"people": {"names": ["Ada", "Grace"]}}).run():
        yield "iteration", event
    for event in engine(examples.example("loop"), {"target": 2}).run():
        yield "loop", event
    with failing_service() as url:
        retried = examples.example("http")
        examples.node_data(retried, "ask")["url"] = url
        for event in engine(retried, {"name": "Ada"}).run():
            yield "retried", event


@pytest.fixture(scope="module")
def events() -> list[tuple[str, dict[str, Any]]]:
    return list(all_kinds())


def test_every_kind_of_event_is_emitted(events: list[tuple[str, dict[str, Any]]]) -> None:
    assert {event["event"] for _, event in events} == set(DIFY_DATA_FIELDS)
    statuses = {event["data"]["status"] for _, event in events if event["event"] == "workflow_finished"}
    assert statuses == {"succeeded", "failed", "stopped"}
    assert {event["data"]["status"] for _, event in events if event["event"] == "node_finished"} == {
        "succeeded",
        "failed",
        "stopped",
    }
    assert {event["data"]["status"] for _, event in events if event["event"] == "node_retry"} == {"retry"}


def test_every_event_conforms_to_the_published_spec(events: list[tuple[str, dict[str, Any]]]) -> None:
    for run, event in events:
        validate_spec(event_schema(event["event"]), event, f"{event['event']} of the {run} run")


def test_every_event_has_exactly_the_fields_of_dify_s_model(events: list[tuple[str, dict[str, Any]]]) -> None:
    for run, event in events:
        name, what = event["event"], f"{event['event']} of the {run} run"
        assert set(event) == ENVELOPE, what
        data = event["data"]
        missing, unknown = sorted(DIFY_DATA_FIELDS[name] - set(data)), sorted(set(data) - DIFY_DATA_FIELDS[name])
        assert not missing and not unknown, f"{what}: missing {missing}, unknown {unknown}"
        if name == "node_finished" and data["execution_metadata"] is not None:
            assert set(data["execution_metadata"]) <= DIFY_METADATA_KEYS, f"{what}: {data['execution_metadata']}"
        if name in ("node_started", "node_finished"):
            # Dify's default for these is true: an engine that cuts nothing must say false.
            assert all(data[key] is False for key in data if key.endswith("_truncated")), what
        if name == "human_input_required":
            check_form(data, what)
        if name == "workflow_paused":
            for reason in data["reasons"]:
                assert set(reason) == DIFY_PAUSE_REASON_FIELDS and reason["TYPE"] == "human_input_required", what
                check_form(reason, what)


def check_form(form: dict[str, Any], what: str) -> None:
    for field in form["inputs"]:
        assert set(field) == DIFY_FORM_INPUT_FIELDS[field["type"]], f"{what}: {field}"
        for key in ("default", "option_source"):
            if field.get(key) is not None:
                assert set(field[key]) == DIFY_SOURCE_FIELDS, f"{what}: {field}"
    assert all(set(action) == DIFY_ACTION_FIELDS for action in form["actions"]), f"{what}: {form['actions']}"
    assert all(isinstance(value, str) for value in form["resolved_default_values"].values()), what
