"""A paused run is graphon's snapshot stored with the run: it resumes in another process, and a snapshot
made by the previous pinned graphon (0.7.0) resumes under this one.

``fixtures/graphon-0.7.0-paused.json`` was made once by graphon 0.7.0 in a throwaway environment (Python
3.12, ``pip install --no-deps graphon==0.7.0`` and its light dependencies), running
``fixtures/approval.yml`` until its human-input node paused; it is kept as the engine stores a pause.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from api.core.workflow import ModelSettings, ResumePoint, WorkflowEngine, load_app, parse
from harness.processes import ROOT
from tests.app import examples

FIXTURES = ROOT / "tests" / "app" / "fixtures"


def _engine(graph: dict[str, Any], inputs: dict[str, Any], **kwargs: Any) -> WorkflowEngine:
    return WorkflowEngine(
        graph,
        app_id="app",
        task_id="task",
        workflow_run_id="run-07",
        inputs=inputs,
        user="u",
        created_at=time.time(),
        models=ModelSettings(token_delay=0),
        **kwargs,
    )


def test_a_snapshot_of_graphon_0_7_resumes_under_the_pinned_graphon() -> None:
    app = load_app(parse((FIXTURES / "approval.yml").read_text()))
    state = json.loads((FIXTURES / "graphon-0.7.0-paused.json").read_text())
    assert state["graphon_version"] == "0.7.0" and state["snapshot_version"] == "2.0"
    answer = {"kind": "submission", "inputs": {"note": "ok"}, "action": "submit"}
    engine = _engine(app.graph, {"name": "Ada"}, resume=ResumePoint(state, answer))
    events = list(engine.run())
    assert events[0]["data"]["reason"] == "resumption"
    assert [e["data"]["node_id"] for e in events if e["event"] == "node_started"] == ["approve", "final", "end"]
    assert events[-1]["data"]["status"] == "succeeded"
    assert events[-1]["data"]["outputs"] == {"greeting": "Hello Ada (ok)"}


RESUME = """
import json, sys, time
from api.core.workflow import ModelSettings, ResumePoint, WorkflowEngine
graph, state = json.loads(sys.stdin.read())
engine = WorkflowEngine(graph, app_id="app", task_id="task", workflow_run_id="run", inputs={"name": "Ada",
    "mood": "formal"}, user="u", created_at=time.time(), models=ModelSettings(token_delay=0),
    resume=ResumePoint(state, {"kind": "submission", "inputs": {"approved": "true"}, "action": "submit"}))
print(json.dumps(list(engine.run())))
"""


def test_a_pause_resumes_in_another_process() -> None:
    graph = examples.graph_of(examples.greeting())
    paused = _engine(graph, {"name": "Ada", "mood": "formal"})
    assert [e["event"] for e in paused.run()][-1] == "workflow_paused"
    assert paused.outcome is not None and paused.outcome.state is not None
    done = subprocess.run(
        [sys.executable, "-c", RESUME],
        input=json.dumps([graph, paused.outcome.state]),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    )
    events = json.loads(done.stdout)
    assert events[0]["data"]["reason"] == "resumption"
    assert events[-1]["data"]["status"] == "succeeded"
    assert events[-1]["data"]["outputs"]["greeting"].endswith("(approved: true)")
