"""The workflow engine on its own: graphon running the DSL examples, Dify's events, pause and resume, stops,
refusals at load time."""

from __future__ import annotations

import copy
import json
import math
import threading
import time
from typing import Any

import pytest

from api.core.workflow import ModelSettings, ResumePoint, WorkflowDefinitionError, WorkflowEngine, load_app
from api.core.workflow.engine import STATE_FORMAT, STATE_FORMAT_VERSION, graphon_version
from api.core.workflow.human_input import new_ticket
from tests.app import examples
from tests.app.loopback import greeting_service

GREETING = examples.greeting()
FORMAL = {"name": "Ada", "mood": "formal"}
APPROVE = {"kind": "submission", "inputs": {"approved": "true"}, "action": "submit"}


def run_engine(
    definition: dict[str, Any], inputs: dict[str, Any], **kwargs: Any
) -> tuple[WorkflowEngine, list[dict[str, Any]]]:
    kwargs.setdefault("models", ModelSettings(token_delay=0))
    engine = WorkflowEngine(
        examples.graph_of(definition),
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs=inputs,
        user="u",
        created_at=time.time(),
        **kwargs,
    )
    return engine, list(engine.run())


def names(events: list[dict[str, Any]]) -> list[str]:
    return [event["event"] for event in events]


def test_a_cheerful_greeting_streams_from_the_model_to_the_end_node() -> None:
    engine, events = run_engine(GREETING, {"name": "Ada"}, models=ModelSettings(token_delay=0.005))
    assert names(events)[0] == "workflow_started" and names(events)[-1] == "workflow_finished"
    assert all(set(event) == {"event", "task_id", "workflow_run_id", "data"} for event in events)
    started = [e["data"]["node_id"] for e in events if e["event"] == "node_started"]
    assert started == ["start", "is_formal", "draft", "casual_end"]
    chunks = [e for e in events if e["event"] == "text_chunk"]
    text = "".join(e["data"]["text"] for e in chunks)
    assert text == "Hello Ada! It is a wonderful day to build durable streams together."
    # Streamed while the model answers: every chunk comes between the model node's start and its end.
    draft_started = next(
        i for i, e in enumerate(events) if e["event"] == "node_started" and e["data"]["node_id"] == "draft"
    )
    draft_finished = next(
        i for i, e in enumerate(events) if e["event"] == "node_finished" and e["data"]["node_id"] == "draft"
    )
    assert len(chunks) > 5 and all(draft_started < events.index(c) < draft_finished for c in chunks)
    assert all(c["data"]["from_variable_selector"] == ["draft", "text"] for c in chunks)
    finished = events[-1]["data"]
    assert finished["status"] == "succeeded" and finished["outputs"] == {"greeting": text}
    assert engine.outcome is not None and engine.outcome.status == "succeeded"


def test_only_text_that_reaches_an_end_node_streams() -> None:
    # The formal draft goes to a form, not to an end node: none of its words stream.
    _, events = run_engine(GREETING, FORMAL)
    assert "text_chunk" not in names(events)


def test_a_form_is_never_due_before_its_timeout() -> None:
    # Dify's expiration_time is whole seconds; a form of half a second must not be due when it opens.
    opened_at = time.time()
    _, events = run_engine(GREETING, FORMAL, form_timeout=0.5)
    form = events[-2]["data"]
    assert isinstance(form["expiration_time"], int)
    assert opened_at + 0.5 <= form["expiration_time"] <= math.ceil(time.time() + 0.5)  # its timeout, rounded up


def test_a_formal_greeting_pauses_for_its_form_and_resumes_from_graphon_s_snapshot() -> None:
    opened: list[dict[str, Any]] = []
    engine, events = run_engine(GREETING, FORMAL, open_form=lambda node, form: opened.append(dict(form)))
    assert names(events)[-2:] == ["human_input_required", "workflow_paused"]
    form = events[-2]["data"]
    assert opened == [form]  # stored before any client could read its token
    assert form["node_id"] == "approve" and form["node_title"] == "Approve the greeting"
    assert [field["output_variable_name"] for field in form["inputs"]] == ["approved", "note"]
    assert form["actions"] == [{"id": "submit", "title": "Submit", "button_style": "primary"}]
    # The run's variables are written into the form's content; the fields' places stay for the answer.
    assert form["form_content"].startswith("Hello Ada! It is a wonderful day")
    assert "{{#$output.approved#}}" in form["form_content"]
    assert len(form["form_token"]) == 22 and form["expiration_time"] > time.time() + 2 * 24 * 3600
    paused = events[-1]["data"]
    assert paused["paused_nodes"] == ["approve"] and paused["reasons"] == [{"TYPE": "human_input_required", **form}]
    assert paused["status"] == "paused" and paused["total_tokens"] > 0
    assert engine.outcome is not None and engine.outcome.status == "paused"
    state = json.loads(json.dumps(engine.outcome.state))  # the state survives a trip through the database
    assert state["format"] == STATE_FORMAT and state["format_version"] == STATE_FORMAT_VERSION
    assert state["graphon_version"] == graphon_version() and state["snapshot_version"] == "3.0"

    _resumed, more = run_engine(GREETING, FORMAL, resume=ResumePoint(state, APPROVE))
    # graphon's response coordinator may stream the end node's first words as soon as the answer is in,
    # before the form node's own end is published: the form node's events keep their order, the words
    # come after the answer.
    approve = [e for e in more if e["data"].get("node_id") == "approve"]
    assert names(more)[0] == "workflow_started" and more[0]["data"]["reason"] == "resumption"
    assert names(approve) == ["node_started", "human_input_form_filled", "node_finished"]
    assert more[1] is approve[0] and approve[0]["data"]["id"] == approve[2]["data"]["id"]
    filled = approve[1]["data"]
    assert filled["action_id"] == "submit" and filled["action_text"] == "Submit"
    assert "Approved: true" in filled["rendered_content"]
    assert approve[2]["data"]["outputs"]["__action_id"] == "submit"
    answered = more.index(approve[1])
    assert all(more.index(e) > answered for e in more if e["event"] == "text_chunk")
    assert more[-1]["data"]["status"] == "succeeded"
    assert more[-1]["data"]["outputs"]["greeting"].endswith("(approved: true)")
    # The tokens and steps before the pause count in the run's totals.
    assert more[-1]["data"]["total_tokens"] == paused["total_tokens"]
    assert more[-1]["data"]["total_steps"] > paused["total_steps"]


def test_an_expired_form_fails_the_run_with_its_timeout_event() -> None:
    engine, events = run_engine(GREETING, FORMAL)
    assert engine.outcome is not None and engine.outcome.state is not None
    _, more = run_engine(GREETING, FORMAL, resume=ResumePoint(engine.outcome.state, {"kind": "timeout"}))
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
    engine, _events = run_engine(GREETING, FORMAL)
    assert engine.outcome is not None
    answer = {"kind": "submission", "inputs": {"approved": "yes"}, "action": "submit"}
    _, more = run_engine(GREETING, FORMAL, resume=ResumePoint(engine.outcome.state or {}, answer))
    assert more[-1]["data"]["status"] == "failed" and "approved" in more[-1]["data"]["error"]


def test_nodes_say_where_the_engine_came_from_what_they_read_and_spent() -> None:
    _, events = run_engine(GREETING, {"name": "Ada"})
    started = [e["data"] for e in events if e["event"] == "node_started"]
    assert [s["predecessor_node_id"] for s in started] == [None, "start", "is_formal", "draft"]
    llm = next(e["data"] for e in events if e["event"] == "node_finished" and e["data"]["node_id"] == "draft")
    chunks = [e for e in events if e["event"] == "text_chunk"]
    assert set(llm["execution_metadata"]) >= {"total_tokens", "total_price", "currency"}
    usage = llm["process_data"]["usage"]
    assert "".join(chunk["data"]["text"] for chunk in chunks) == llm["outputs"]["text"]
    assert usage["completion_tokens"] == 12 and usage["prompt_tokens"] > 0  # the answer's words
    assert llm["execution_metadata"]["total_tokens"] == usage["total_tokens"]
    assert all(s["inputs_truncated"] is False and s["agent_strategy"] is None for s in started)
    assert llm["process_data"]["prompts"][0]["text"] == "Write a cheerful greeting for Ada"
    assert events[-1]["data"]["total_tokens"] == usage["total_tokens"]
    first = events[0]["data"]
    assert first["reason"] == "initial" and first["inputs"]["name"] == "Ada"
    assert first["inputs"]["sys.user_id"] == "u" and first["inputs"]["sys.workflow_run_id"] == "run"


def test_a_failing_model_fails_the_run_through_the_event_path() -> None:
    failing = examples.script_model(GREETING, error_after_tokens=3, error="model overloaded")
    _, events = run_engine(failing, {"name": "Ada"})
    assert len([e for e in events if e["event"] == "text_chunk"]) == 3
    assert events[-2]["event"] == "node_finished" and events[-2]["data"]["status"] == "failed"
    assert events[-1]["data"]["status"] == "failed" and events[-1]["data"]["error"] == "model overloaded"


def test_a_missing_required_input_fails_the_run() -> None:
    _, events = run_engine(GREETING, {})
    assert names(events) == ["workflow_started", "workflow_finished"]
    assert events[-1]["data"]["status"] == "failed" and events[-1]["data"]["error"] == "input 'name' is required"


def test_a_stop_mid_stream_ends_the_model_within_100_ms() -> None:
    """The model checks the stop between chunks (graphon's dispatcher only between nodes)."""
    delay = 0.05  # the test's own setting: the stop must land well within one chunk's delay plus 100 ms
    slow = examples.script_model(GREETING, response=" ".join(f"word{i}" for i in range(400)), token_delay=delay)
    stop_at: list[float] = []

    def should_stop() -> str | None:
        return "stopped by user" if stop_at else None

    engine = WorkflowEngine(
        examples.graph_of(slow),
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs={"name": "Ada"},
        user="u",
        created_at=time.time(),
        should_stop=should_stop,
    )
    events = []
    for event in engine.run():
        events.append(event)
        if event["event"] == "text_chunk" and len(events) > 10 and not stop_at:
            stop_at.append(time.monotonic())
    ended = time.monotonic()
    chunks_after = [e for e in events[events.index(next(e for e in events if e["event"] == "text_chunk")) :]]
    assert events[-1]["data"]["status"] == "stopped" and events[-1]["data"]["error"] == "stopped by user"
    assert len([e for e in chunks_after if e["event"] == "text_chunk"]) < 40  # nowhere near the 400 words
    stopped_node = next(e for e in events if e["event"] == "node_finished" and e["data"]["node_id"] == "draft")
    assert stopped_node["data"]["status"] == "stopped"
    # One chunk may be on its way when the stop is seen (at the next event): the bound is one delay + 100 ms.
    assert ended - stop_at[0] <= delay + 0.1, ended - stop_at[0]


def test_a_consumer_that_stops_reading_leaves_no_node_running() -> None:
    slow = examples.script_model(GREETING, response=" ".join(f"w{i}" for i in range(1000)), token_delay=0.01)
    before = {thread.ident for thread in threading.enumerate()}
    engine = WorkflowEngine(
        examples.graph_of(slow),
        app_id="app",
        task_id="task",
        workflow_run_id="run",
        inputs={"name": "Ada"},
        user="u",
        created_at=time.time(),
    )
    run = engine.run()
    for event in run:
        if event["event"] == "text_chunk":
            break
    assert len({thread.ident for thread in threading.enumerate()} - before) >= 2  # graphon's dispatcher, workers
    run.close()  # type: ignore[attr-defined]
    left = [thread for thread in threading.enumerate() if thread.ident not in before and thread.is_alive()]
    assert left == [], left
    assert engine.signal.reason is not None


def test_an_iteration_of_1000_items() -> None:
    names_ = [f"person{i}" for i in range(1000)]
    started = time.perf_counter()
    _, events = run_engine(examples.example("iteration"), {"people": {"names": names_}})
    took = time.perf_counter() - started
    assert events[-1]["data"]["status"] == "succeeded", events[-1]["data"]
    greetings = events[-1]["data"]["outputs"]["greetings"]
    assert len(greetings) == 1000 and greetings[0] == "1. Hello person0!" and greetings[-1] == "1000. Hello person999!"
    assert names(events).count("iteration_next") == 1000
    inner = [e["data"] for e in events if e["event"] == "node_started" and e["data"]["node_id"] == "greet"]
    assert len(inner) == 1000 and all(data["iteration_id"] == "each" for data in inner)
    print(f"1,000-item iteration: {took:.2f} s, {len(events)} events")


def test_a_loop_counts_to_its_break_condition() -> None:
    _, events = run_engine(examples.example("loop"), {"target": 4})
    assert events[-1]["data"]["outputs"] == {"count": 4, "lines": ["turn 1", "turn 2", "turn 3", "turn 4"]}
    assert {"loop_started", "loop_next", "loop_completed"} <= set(names(events))
    inner = [e["data"] for e in events if e["event"] == "node_started" and e["data"]["node_id"] == "step"]
    assert len(inner) == 4 and all(data["loop_id"] == "count" for data in inner)


def test_an_http_request_to_a_loopback_service() -> None:
    definition = examples.example("http")
    with greeting_service() as url:
        examples.node_data(definition, "ask")["url"] = url
        load_app(definition, allowed_hosts=frozenset({"127.0.0.1"}))
        _, events = run_engine(definition, {"name": "Ada"})
    outputs = events[-1]["data"]["outputs"]
    assert outputs["status"] == 200 and json.loads(outputs["answer"]) == {"greeting": "Hello Ada from the service"}


def _with_node(node_type: str, **data: Any) -> dict[str, Any]:
    definition = copy.deepcopy(GREETING)
    examples.graph_of(definition)["nodes"].append({"id": "extra", "data": {"type": node_type, "title": "X", **data}})
    return definition


@pytest.mark.parametrize(
    "definition, message",
    [
        (_with_node("code", code="print(1)", code_language="python3"), r"'extra' \(code\): a code node needs"),
        (_with_node("tool"), r"'extra' \(tool\): a tool node needs Dify's plugin daemon"),
        (_with_node("document-extractor"), r"'extra' \(document-extractor\): .* the 'documents' extra"),
        (_with_node("teleport"), r"'extra' \(teleport\): this app does not know"),
        (_with_node("start"), "exactly one 'start'"),
        (_with_node("if-else", cases="not a list"), "graph: "),
        ({**GREETING, "kind": "rag_pipeline"}, "'kind' must be 'app'"),
        ({**GREETING, "app": {"name": "x", "mode": "advanced-chat"}}, "only 'workflow' apps"),
    ],
)
def test_what_this_app_cannot_run_is_refused_in_one_line(definition: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=message) as refused:
        load_app(definition)
    assert "\n" not in str(refused.value)


def test_an_http_request_to_a_host_not_allowed_is_refused() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"host '127\.0\.0\.1' is not allowed"):
        load_app(examples.example("http"))
    assert load_app(examples.example("http"), allowed_hosts=frozenset({"127.0.0.1"})).name == "Ask a service"


def test_every_example_loads() -> None:
    for name in ("greeting", "iteration", "loop", "http"):
        assert load_app(examples.example(name), allowed_hosts=frozenset({"127.0.0.1"})).mode == "workflow"


def test_form_tokens_never_begin_with_a_dash() -> None:
    """A token is pasted into shells: one in 64 URL-safe tokens would otherwise begin with an option's dash."""
    tokens = {new_ticket(0).form_token for _ in range(2_000)}
    assert len(tokens) == 2_000
    assert not [token for token in tokens if token.startswith("-")]
    assert all(len(token) == 22 for token in tokens)


def test_question_classifier_and_parameter_extractor_run_on_the_model_runtime() -> None:
    model = {"provider": "simulated", "name": "simulated", "mode": "chat", "completion_params": {}}
    start = {"type": "start", "title": "Start", "variables": [{"variable": "q", "label": "q", "type": "text-input"}]}
    classes = [{"id": "1", "name": "greeting"}, {"id": "2", "name": "other"}]
    classify = {"type": "question-classifier", "title": "C", "query_variable_selector": ["start", "q"], "model": model}
    extract = {"type": "parameter-extractor", "title": "E", "query": ["start", "q"], "model": model}
    who = {"name": "who", "type": "string", "description": "who is greeted", "required": False}
    outputs = [
        {"variable": "class", "value_selector": ["qc", "class_name"]},
        {"variable": "who", "value_selector": ["pe", "who"]},
    ]
    graph = {
        "nodes": [
            {"id": "start", "data": start},
            {"id": "qc", "data": {**classify, "classes": classes, "instruction": ""}},
            {"id": "pe", "data": {**extract, "reasoning_mode": "prompt", "parameters": [who]}},
            {"id": "end", "data": {"type": "end", "title": "End", "outputs": outputs}},
        ],
        "edges": [
            {"id": "a", "source": "start", "target": "qc", "sourceHandle": "source"},
            {"id": "b", "source": "qc", "target": "pe", "sourceHandle": "1"},
            {"id": "c", "source": "qc", "target": "pe", "sourceHandle": "2"},
            {"id": "d", "source": "pe", "target": "end", "sourceHandle": "source"},
        ],
    }
    definition = {"kind": "app", "app": {"name": "model nodes", "mode": "workflow"}, "workflow": {"graph": graph}}
    load_app(definition)
    _, events = run_engine(definition, {"q": "hello there"})
    finished = events[-1]["data"]
    # The simulated model's answer is no category: the classifier takes its first class, as Dify's does.
    assert finished["status"] == "succeeded" and finished["outputs"]["class"] == "greeting", finished
    models = [e["data"] for e in events if e["event"] == "node_finished" and e["data"]["node_id"] in ("qc", "pe")]
    assert len(models) == 2 and all(data["execution_metadata"]["total_tokens"] > 0 for data in models)
