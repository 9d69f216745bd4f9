"""The JSON app format of earlier versions, converted once at create-app into a Dify graph, runs on graphon.

``fixtures/greeting-0.1.json`` is ``examples/greeting.json`` as the app shipped it before Dify's DSL.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from api.core.workflow import ModelSettings, ResumePoint, WorkflowDefinitionError, WorkflowEngine, load_app
from api.core.workflow.legacy import is_legacy
from harness.processes import ROOT

OLD = json.loads((ROOT / "tests" / "app" / "fixtures" / "greeting-0.1.json").read_text())


def run(graph: dict[str, Any], inputs: dict[str, Any], **kwargs: Any) -> tuple[WorkflowEngine, list[dict[str, Any]]]:
    engine = WorkflowEngine(
        graph,
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs=inputs,
        user="u",
        created_at=time.time(),
        models=ModelSettings(token_delay=0.001),
        **kwargs,
    )
    return engine, list(engine.run())


def test_the_old_greeting_converts_into_a_dify_graph_and_runs_both_ways() -> None:
    assert is_legacy(OLD)
    app = load_app(OLD)
    assert app.name == "Greeting with approval" and app.mode == "workflow"
    types = {node["id"]: node["data"]["type"] for node in app.graph["nodes"]}
    assert types["draft"] == "llm" and types["is_long"] == "if-else" and types["approve"] == "human-input"
    assert types["final"] == "template-transform" and types["formal_end"] == "end"

    _, casual = run(app.graph, {"name": "Ada"})
    assert casual[-1]["data"]["outputs"] == {
        "greeting": "Hello Ada! It is a wonderful day to build durable streams together."
    }
    engine, formal = run(app.graph, {"name": "Ada", "mood": "formal"})
    assert formal[-1]["event"] == "workflow_paused" and engine.outcome is not None
    answer = {"kind": "submission", "inputs": {"approved": "true"}, "action": "submit"}
    _, resumed = run(
        app.graph, {"name": "Ada", "mood": "formal"}, resume=ResumePoint(engine.outcome.state or {}, answer)
    )
    assert resumed[-1]["data"]["outputs"] == {
        "greeting": "Hello Ada! It is a wonderful day to build durable streams together. (approved: true)"
    }


def test_an_old_definition_with_an_unknown_node_type_is_refused() -> None:
    broken = json.loads(json.dumps(OLD))
    broken["graph"]["nodes"].append({"id": "x", "type": "teleport"})
    with pytest.raises(WorkflowDefinitionError, match="unknown type 'teleport'"):
        load_app(broken)
