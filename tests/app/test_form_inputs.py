"""Dify's form input types on a human-input node, in the engine alone: how a graph declares them, how
the form shows them, which submissions each takes, and what the filled form says."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest

from api.core.workflow import Graph, ModelSettings, ResumePoint, WorkflowDefinitionError, WorkflowEngine
from api.core.workflow.forms import InvalidSubmissionError, check_submission

#: Every type of Dify's form input union, one field each, with every setting a graph may give them.
FIELDS: list[dict[str, Any]] = [
    {"name": "decision", "type": "select", "options": ["approve", "reject"]},
    {"name": "flavour", "type": "select", "option_source": {"type": "variable", "selector": ["start", "flavours"]}},
    {"name": "comment", "type": "paragraph", "default": {"type": "variable", "selector": ["start", "name"]}},
    {"name": "report", "type": "file", "allowed_file_types": ["document"], "allowed_file_extensions": [".PDF"]},
    {
        "name": "photos",
        "type": "file-list",
        "allowed_file_types": ["image"],
        "allowed_file_upload_methods": ["remote_url"],
        "number_limits": 2,
        "required": False,
    },
]


def graph(fields: list[dict[str, Any]] | None = None, **node: Any) -> dict[str, Any]:
    """A Dify graph: start, a human-input node ``ask`` with ``fields`` (Dify's ``inputs``), end."""
    inputs = [
        {**{key: value for key, value in field.items() if key != "name"}, "output_variable_name": field.get("name")}
        for field in (FIELDS if fields is None else fields)
    ]
    renamed = {"actions": "user_actions"}
    ask = {"type": "human-input", "title": "Review", "inputs": inputs}
    ask.update({renamed.get(key, key): value for key, value in node.items()})
    variables = [{"variable": name, "label": name, "type": "paragraph"} for name in ("name", "flavours")]
    return {
        "nodes": [
            {"id": "start", "data": {"type": "start", "title": "Start", "variables": variables}},
            {"id": "ask", "data": ask},
            {"id": "end", "data": {"type": "end", "title": "End", "outputs": [
                {"variable": "decision", "value_selector": ["ask", "decision"]},
            ]}},
        ],
        "edges": [
            {"id": "e1", "source": "start", "target": "ask", "sourceHandle": "source"},
            {"id": "e2", "source": "ask", "target": "end", "sourceHandle": "source"},
        ],
    }  # fmt: skip


INPUTS = {"name": "Ada", "flavours": ["vanilla", "mint"]}
PDF = {"type": "document", "transfer_method": "local_file", "upload_file_id": "f-1", "extension": "pdf"}
PHOTO = {"type": "image", "transfer_method": "remote_url", "url": "https://example.invalid/a.png"}


def run(definition: dict[str, Any], **kwargs: Any) -> tuple[WorkflowEngine, list[dict[str, Any]]]:
    engine = WorkflowEngine(
        definition,
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs=INPUTS,
        user="u",
        created_at=time.time(),
        models=ModelSettings(token_delay=0),
        **kwargs,
    )
    return engine, list(engine.run())


def paused_form() -> tuple[dict[str, Any], dict[str, Any]]:
    """The form the review node shows, and the engine state a resumed attempt starts from."""
    engine, events = run(graph())
    assert [event["event"] for event in events][-2:] == ["human_input_required", "workflow_paused"]
    assert engine.outcome is not None and engine.outcome.state is not None
    return events[-2]["data"], json.loads(json.dumps(engine.outcome.state))


def test_each_type_is_shown_as_dify_dumps_its_form_input() -> None:
    form, _ = paused_form()
    assert form["inputs"] == [
        {
            "output_variable_name": "decision",
            "type": "select",
            "option_source": {"type": "constant", "selector": [], "value": ["approve", "reject"]},
        },
        # A variable's options are resolved into the form, as Dify resolves them.
        {
            "output_variable_name": "flavour",
            "type": "select",
            "option_source": {"type": "variable", "selector": ["start", "flavours"], "value": ["vanilla", "mint"]},
        },
        {
            "output_variable_name": "comment",
            "type": "paragraph",
            "default": {"type": "variable", "selector": ["start", "name"], "value": ""},
        },
        {
            "output_variable_name": "report",
            "type": "file",
            "allowed_file_types": ["document"],
            "allowed_file_extensions": [".pdf"],
            "allowed_file_upload_methods": [],
        },
        {
            "output_variable_name": "photos",
            "type": "file-list",
            "allowed_file_types": ["image"],
            "allowed_file_extensions": [],
            "allowed_file_upload_methods": ["remote_url"],
            "number_limits": 2,
        },
    ]
    assert form["resolved_default_values"] == {"comment": "Ada"}
    assert form["approval_channels"] == [] and form["display_in_ui"] is True


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([{"name": "x", "type": "date"}], "has type 'date'"),
        ([{"name": "x", "type": "select"}], "non-empty list of string options"),
        ([{"name": "x", "type": "select", "options": [1, 2]}], "non-empty list of string options"),
        ([{"name": "x", "type": "file", "allowed_file_types": ["pdf"]}], "allowed_file_types"),
        ([{"name": "x", "type": "file", "allowed_file_types": ["custom"]}], "need 'allowed_file_extensions'"),
        ([{"name": "x", "type": "file", "allowed_file_upload_methods": ["ftp"]}], "upload methods"),
        ([{"name": "x", "type": "file-list", "number_limits": -1}], "number_limits"),
        ([{"name": "x", "type": "paragraph", "default": {"type": "variable", "selector": ["a"]}}], "selector"),
        ([{"name": "x"}, {"name": "x"}], "same name"),
        ([{"type": "paragraph"}], "'form' must be a list"),
    ],
)
def test_a_graph_with_a_field_dify_would_not_take_is_refused(fields: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=message):
        Graph(graph(fields))


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        ([{"id": "ok go"}], "identifier"),
        ([{"id": "a" * 21}], "identifier"),
        ([{"id": "ok", "title": "t" * 101}], "title"),
        ([{"id": "ok", "button_style": "loud"}], "button_style"),
        ([{"id": "ok"}, {"id": "ok"}], "same id"),
    ],
)
def test_actions_follow_dify_s_rules(actions: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=message):
        Graph(graph([], actions=actions))


@pytest.mark.parametrize("timeout", ["soon", [1], True, -5, float("inf"), float("nan"), 1e308])
def test_a_form_timeout_that_is_not_a_positive_number_is_refused(timeout: Any) -> None:
    # Refused at create-app: at run time it would fail the worker's form, or make the form due at once.
    with pytest.raises(WorkflowDefinitionError, match="timeout must be a positive number"):
        Graph(graph(timeout=timeout, timeout_unit="day"))


def test_a_form_timeout_is_taken_in_its_unit() -> None:
    assert Graph(graph(timeout="2", timeout_unit="hour")).nodes["ask"].config["timeout"] == 7200


VALID = {"decision": "approve", "flavour": "mint", "comment": "fine", "report": PDF, "photos": [PHOTO, PHOTO]}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"decision": "maybe"}, "'decision' must be one of"),
        ({"flavour": "lemon"}, "'flavour' must be one of"),
        ({"comment": 3}, "'comment' must be text"),
        ({"report": "f-1"}, "'report' must be a file object"),
        ({"report": {**PDF, "extension": "docx"}}, r"only \['.pdf'\]"),
        ({"report": {**PDF, "type": "image"}}, "type 'image' are not allowed"),
        ({"report": {"transfer_method": "local_file", "extension": "pdf"}}, "upload_file_id"),
        ({"photos": [PHOTO] * 3}, "at most 2 files"),
        ({"photos": [{**PHOTO, "url": "ftp://x/a.png"}]}, "transfer_method|http"),
        ({"photos": [{**PDF, "type": "image"}]}, "transfer_method must be one of"),
        ({"photos": PHOTO}, "must be a list of file objects"),
    ],
)
def test_a_submission_is_checked_against_the_form_as_shown(changes: dict[str, Any], message: str) -> None:
    form, _ = paused_form()
    node = Graph(graph()).nodes["ask"]
    assert check_submission(node, VALID, "submit", form)[0] == VALID
    with pytest.raises(InvalidSubmissionError, match=message):
        check_submission(node, {**VALID, **changes}, "submit", form)


def test_a_missing_field_takes_its_default_or_is_left_out_if_optional_else_is_refused() -> None:
    form, _ = paused_form()
    node = Graph(graph()).nodes["ask"]
    values, _ = check_submission(node, {"decision": "reject", "flavour": "vanilla", "report": PDF}, None, form)
    assert values == {"decision": "reject", "flavour": "vanilla", "comment": "Ada", "report": PDF}
    with pytest.raises(InvalidSubmissionError, match="'report' is required"):
        check_submission(node, {"decision": "reject", "flavour": "vanilla"}, None, form)


def test_the_filled_form_names_what_was_submitted_and_renders_files_as_dify_does() -> None:
    _, state = paused_form()
    content = "{{#$output.decision#}} / {{#$output.report#}} / {{#$output.photos#}}"
    definition = graph(form_content=content)
    submission = {"kind": "submission", "inputs": VALID, "action": "submit"}
    _, events = run(definition, resume=ResumePoint(state, submission))
    filled = next(event["data"] for event in events if event["event"] == "human_input_form_filled")
    assert filled["rendered_content"] == "approve / [file] / [2 files]"
    assert filled["submitted_data"] == VALID
    assert events[-1]["data"]["status"] == "succeeded" and events[-1]["data"]["outputs"] == {"decision": "approve"}
    assert events[-1]["data"]["created_by"]["user"] == "u"


def test_options_that_are_not_a_list_of_strings_fail_the_node_not_the_engine() -> None:
    inputs = copy.deepcopy(INPUTS)
    inputs["flavours"] = "vanilla"
    engine = WorkflowEngine(
        graph(),
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs=inputs,
        user="u",
        created_at=time.time(),
        models=ModelSettings(token_delay=0),
    )
    events = list(engine.run())
    assert [event["event"] for event in events][-2:] == ["node_finished", "workflow_finished"]
    assert events[-1]["data"]["status"] == "failed" and "not a list of strings" in events[-1]["data"]["error"]
