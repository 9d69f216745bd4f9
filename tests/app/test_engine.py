"""The workflow engine on its own: graph validation, node behaviour, event order, pause and resume."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest

from api.core.workflow import Graph, WorkflowDefinitionError, WorkflowEngine
from api.core.workflow.engine import ResumePoint
from harness.processes import ROOT

GREETING = json.loads((ROOT / "examples" / "greeting.json").read_text())["graph"]


def run_engine(
    graph: dict[str, Any], inputs: dict[str, Any], **kwargs: Any
) -> tuple[WorkflowEngine, list[dict[str, Any]]]:
    engine = WorkflowEngine(
        Graph(graph),
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs=inputs,
        user="u",
        created_at=time.time(),
        token_delay=0,
        **kwargs,
    )
    return engine, list(engine.run())


def names(events: list[dict[str, Any]]) -> list[str]:
    return [event["event"] for event in events]


def test_linear_run_emits_events_in_order_with_the_app_shape() -> None:
    engine, events = run_engine(GREETING, {"name": "Ada"})
    assert names(events)[0] == "workflow_started" and names(events)[-1] == "workflow_finished"
    assert all(set(event) == {"event", "task_id", "workflow_run_id", "data"} for event in events)
    assert [e["data"]["node_id"] for e in events if e["event"] == "node_started"] == [
        "start",
        "draft",
        "is_long",
        "casual_end",
    ]
    chunks = "".join(e["data"]["text"] for e in events if e["event"] == "text_chunk")
    assert chunks == "Hello Ada! It is a wonderful day to build durable streams together."
    assert len([e for e in events if e["event"] == "text_chunk"]) > 5
    finished = events[-1]["data"]
    assert finished["status"] == "succeeded" and finished["outputs"] == {"greeting": chunks}
    assert engine.outcome is not None and engine.outcome.status == "succeeded"


def test_if_else_takes_the_true_branch_and_pauses_for_human_input() -> None:
    opened: list[dict[str, Any]] = []
    engine, events = run_engine(
        GREETING, {"name": "Ada", "mood": "formal"}, open_form=lambda node, form: opened.append(dict(form))
    )
    assert names(events)[-2:] == ["human_input_required", "workflow_paused"]
    form = events[-2]["data"]
    assert opened == [form]  # stored before any client could read its token
    assert form["node_id"] == "approve" and form["node_title"] == "Approve the greeting"
    assert [field["output_variable_name"] for field in form["inputs"]] == ["approved", "note"]
    assert form["actions"] == [{"id": "submit", "title": "Submit", "button_style": "primary"}]
    assert len(form["form_token"]) == 22 and form["expiration_time"] > time.time() + 2 * 24 * 3600
    paused = events[-1]["data"]
    assert paused["paused_nodes"] == ["approve"] and paused["reasons"] == [{"TYPE": "human_input_required", **form}]
    assert paused["status"] == "paused" and paused["total_tokens"] > 0
    assert engine.outcome is not None and engine.outcome.status == "paused"
    state = json.loads(json.dumps(engine.outcome.state))  # the state survives a trip through the database

    submission = {"kind": "submission", "inputs": {"approved": "true"}, "action": "submit"}
    _resumed, more = run_engine(GREETING, {"name": "Ada", "mood": "formal"}, resume=ResumePoint(state, submission))
    assert names(more)[:4] == ["workflow_started", "node_started", "human_input_form_filled", "node_finished"]
    assert more[0]["data"]["reason"] == "resumption"
    assert more[1]["data"]["node_id"] == more[3]["data"]["node_id"] == "approve"
    assert more[1]["data"]["id"] == more[3]["data"]["id"]  # the same execution of the node, paused and resumed
    filled = more[2]["data"]
    assert filled["action_id"] == "submit" and filled["action_text"] == "Submit"
    assert "approved: true" in filled["rendered_content"]
    assert more[3]["data"]["outputs"]["__action_id"] == "submit"
    assert more[-1]["data"]["status"] == "succeeded"
    assert more[-1]["data"]["outputs"]["greeting"].endswith("(approved: true)")
    # The tokens spent before the pause count in the run's total.
    assert more[-1]["data"]["total_tokens"] == paused["total_tokens"]


def test_an_expired_form_fails_the_run_with_its_timeout_event() -> None:
    engine, events = run_engine(GREETING, {"name": "Ada", "mood": "formal"})
    assert engine.outcome is not None and engine.outcome.state is not None
    _, more = run_engine(GREETING, {}, resume=ResumePoint(engine.outcome.state, {"kind": "timeout"}))
    assert names(more) == [
        "workflow_started",
        "node_started",
        "human_input_form_timeout",
        "node_finished",
        "workflow_finished",
    ]
    assert more[2]["data"]["expiration_time"] == events[-2]["data"]["expiration_time"]
    assert more[3]["data"]["status"] == "failed"
    assert more[-1]["data"]["status"] == "failed" and more[-1]["data"]["error"] == "the human input form expired"


def test_invalid_human_input_fails_the_run() -> None:
    engine, _events = run_engine(GREETING, {"name": "Ada", "mood": "formal"})
    assert engine.outcome is not None
    _, more = run_engine(GREETING, {}, resume=ResumePoint(engine.outcome.state or {}, {"approved": "yes"}))
    assert more[-1]["data"]["status"] == "failed" and "approved" in more[-1]["data"]["error"]


def test_nodes_say_where_the_engine_came_from_what_they_read_and_spent() -> None:
    _, events = run_engine(GREETING, {"name": "Ada"})
    started = [e["data"] for e in events if e["event"] == "node_started"]
    assert [s["predecessor_node_id"] for s in started] == [None, "start", "draft", "is_long"]
    assert started[0]["inputs"] == {"name": "Ada"}
    assert started[1]["inputs"] == {"start.mood": "cheerful", "start.name": "Ada"}
    llm = next(e["data"] for e in events if e["event"] == "node_finished" and e["data"]["node_id"] == "draft")
    chunks = [e for e in events if e["event"] == "text_chunk"]
    # Dify's execution metadata has its own keys only; the split of the tokens is the model's usage.
    assert set(llm["execution_metadata"]) == {"total_tokens", "total_price", "currency"}
    usage = llm["process_data"]["usage"]
    assert usage["completion_tokens"] == len(chunks) and usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert llm["execution_metadata"]["total_tokens"] == usage["total_tokens"]
    assert (llm["inputs_truncated"], llm["process_data_truncated"], llm["outputs_truncated"]) == (False,) * 3
    assert all(s["inputs_truncated"] is False and s["agent_strategy"] is None for s in started)
    assert llm["process_data"]["prompts"][0]["text"] == "Write a cheerful greeting for Ada"
    assert events[-1]["data"]["total_tokens"] == usage["total_tokens"]
    first = events[0]["data"]
    assert first["reason"] == "initial" and first["inputs"]["name"] == "Ada"
    assert first["inputs"]["sys.user_id"] == "u" and first["inputs"]["sys.workflow_run_id"] == "run"


def test_a_failing_model_fails_the_run_through_the_event_path() -> None:
    graph = copy.deepcopy(GREETING)
    graph["nodes"][1]["error_after_tokens"] = 3
    graph["nodes"][1]["error"] = "model overloaded"
    _, events = run_engine(graph, {"name": "Ada"})
    assert len([e for e in events if e["event"] == "text_chunk"]) == 3
    assert events[-2]["event"] == "node_finished" and events[-2]["data"]["status"] == "failed"
    assert events[-1]["data"]["status"] == "failed" and events[-1]["data"]["error"] == "model overloaded"


def test_a_stop_request_ends_the_run_between_tokens() -> None:
    calls = {"n": 0}

    def should_stop() -> str | None:
        calls["n"] += 1
        return "stopped by user" if calls["n"] > 4 else None

    _, events = run_engine(GREETING, {"name": "Ada"}, should_stop=should_stop)
    assert events[-1]["data"]["status"] == "stopped" and events[-1]["data"]["error"] == "stopped by user"


def test_missing_variables_fail_the_node() -> None:
    graph = copy.deepcopy(GREETING)
    graph["nodes"][1]["response"] = "{{nowhere.value}}"
    _, events = run_engine(graph, {"name": "Ada"})
    assert events[-1]["data"]["status"] == "failed" and "nowhere.value" in events[-1]["data"]["error"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda g: g["nodes"].append({"id": "start2", "type": "start"}), "exactly one 'start'"),
        (lambda g: g["nodes"].append({"id": "x", "type": "teleport"}), "unknown type"),
        (lambda g: g["edges"].append({"source": "final", "target": "draft"}), "two successors"),
        (lambda g: g["edges"].pop(0), "no successor"),
        (lambda g: g["edges"].append({"source": "formal_end", "target": "draft"}), "cannot have a successor"),
        (lambda g: g["nodes"][1].pop("prompt"), "needs 'prompt'"),
        (lambda g: g["edges"][2].pop("source_handle"), "source_handle"),
    ],
)
def test_invalid_graphs_are_refused(mutate: Any, message: str) -> None:
    graph = copy.deepcopy(GREETING)
    mutate(graph)
    with pytest.raises(WorkflowDefinitionError, match=message):
        Graph(graph)


def test_cycles_are_refused() -> None:
    graph = {
        "nodes": [
            {"id": "s", "type": "start"},
            {"id": "a", "type": "template", "template": "x"},
            {"id": "b", "type": "if_else", "conditions": []},
            {"id": "e", "type": "end", "outputs": {}},
        ],
        "edges": [
            {"source": "s", "target": "a"},
            {"source": "a", "target": "b"},
            {"source": "b", "source_handle": "true", "target": "a"},
            {"source": "b", "source_handle": "false", "target": "e"},
        ],
    }
    with pytest.raises(WorkflowDefinitionError, match="cycle"):
        Graph(graph)


def test_form_defaults_are_resolved_to_strings_as_dify_clients_read_them() -> None:
    graph = copy.deepcopy(GREETING)
    graph["nodes"][3]["form"] = [
        {"name": "approved", "type": "boolean", "default": False},  # a graph of before Dify's types
        {"name": "note", "default": "ok"},
        {"name": "who", "type": "paragraph", "default": {"type": "variable", "selector": ["start", "name"]}},
    ]
    _, events = run_engine(graph, {"name": "Ada", "mood": "formal"})
    form = events[-2]["data"]
    assert form["resolved_default_values"] == {"approved": "false", "note": "ok", "who": "Ada"}
    assert form["inputs"] == [
        {
            "output_variable_name": "approved",
            "type": "select",
            "option_source": {"type": "constant", "selector": [], "value": ["true", "false"]},
        },
        {
            "output_variable_name": "note",
            "type": "paragraph",
            "default": {"type": "constant", "selector": [], "value": "ok"},
        },
        {
            "output_variable_name": "who",
            "type": "paragraph",
            "default": {"type": "variable", "selector": ["start", "name"], "value": ""},
        },
    ]


def test_form_tokens_never_begin_with_a_dash() -> None:
    """A token is pasted into shells: one in 64 URL-safe tokens would otherwise begin with an option's dash."""
    from api.core.workflow.engine import new_ticket

    tokens = {new_ticket(0).form_token for _ in range(2_000)}
    assert len(tokens) == 2_000
    assert not [token for token in tokens if token.startswith("-")]
    assert all(len(token) == 22 for token in tokens)
