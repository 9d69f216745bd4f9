"""Runs a workflow graph and yields its events, one execution attempt at a time.

An attempt ends in exactly one of: ``workflow_finished`` (succeeded, failed or stopped) or
``workflow_paused`` at a human-input node, after which :attr:`WorkflowEngine.outcome` holds the
state a later attempt resumes from. Node failures end the run as ``failed`` through the normal
event path; anything else the engine raises is the caller's to turn into a failed run.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .errors import NodeRunError
from .events import make_event, now
from .graph import Graph, Node
from .nodes import (
    PauseRequested,
    StopRequested,
    evaluate_if_else,
    run_end,
    run_llm,
    run_start,
    run_template,
    validate_form,
)
from .variables import VariablePool


@dataclasses.dataclass
class EngineOutcome:
    status: str  # succeeded | failed | stopped | paused
    outputs: dict[str, Any] | None = None
    error: str | None = None
    #: For ``paused``: what a resumed attempt needs (paused node, variable pool, step count).
    state: dict[str, Any] | None = None
    steps: int = 0


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    state: Mapping[str, Any]
    form: Mapping[str, Any]


class WorkflowEngine:
    def __init__(
        self,
        graph: Graph,
        *,
        app_id: str,
        task_id: str,
        workflow_run_id: str,
        inputs: Mapping[str, Any],
        user: str,
        created_at: float,
        token_delay: float = 0.02,
        should_stop: Callable[[], str | None] = lambda: None,
        resume: ResumePoint | None = None,
    ) -> None:
        self.graph = graph
        self.app_id = app_id
        self.task_id = task_id
        self.workflow_run_id = workflow_run_id
        self.inputs = dict(inputs)
        self.user = user
        self.created_at = created_at
        self.token_delay = token_delay
        self.should_stop = should_stop
        self.resume = resume
        self.outcome: EngineOutcome | None = None

    def _event(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        return make_event(name, task_id=self.task_id, workflow_run_id=self.workflow_run_id, data=data)

    def run(self) -> Iterator[dict[str, Any]]:
        steps = 0
        if self.resume is None:
            pool = VariablePool({"sys": {"user": self.user, "workflow_run_id": self.workflow_run_id}})
            node: Node | None = self.graph.start
            yield self._event(
                "workflow_started",
                {
                    "id": self.workflow_run_id,
                    "workflow_id": self.app_id,
                    "inputs": self.inputs,
                    "created_at": int(self.created_at),
                },
            )
        else:
            state = self.resume.state
            pool = VariablePool({key: dict(value) for key, value in state["variables"].items()})
            steps = int(state["steps"])
            paused = self.graph.nodes[state["node_id"]]
            execution_id = str(state.get("execution_id") or uuid.uuid4())
            try:
                outputs = validate_form(paused, self.resume.form)
            except NodeRunError as exc:
                yield self._node_finished(paused, execution_id, steps, "failed", None, str(exc), time.monotonic())
                yield self._finished("failed", None, str(exc), steps)
                return
            pool.set_outputs(paused.id, outputs)
            yield self._node_finished(paused, execution_id, steps, "succeeded", outputs, None, time.monotonic())
            node = self.graph.successor(paused.id)

        while node is not None:
            reason = self.should_stop()
            if reason:
                yield self._finished("stopped", None, reason, steps)
                return
            steps += 1
            execution_id = str(uuid.uuid4())
            started = time.monotonic()
            yield self._event(
                "node_started",
                {
                    "id": execution_id,
                    "node_id": node.id,
                    "node_type": node.type,
                    "title": node.title,
                    "index": steps,
                    "created_at": now(),
                },
            )
            handle: str | None = None
            try:
                if node.type == "start":
                    outputs = run_start(node, pool, self.inputs)
                elif node.type == "llm":
                    runner = run_llm(node, pool, self.token_delay, self.should_stop)
                    while True:
                        try:
                            token = next(runner)
                        except StopIteration as done:
                            outputs = done.value
                            break
                        yield self._event("text_chunk", {"text": token, "from_variable_selector": [node.id, "text"]})
                elif node.type == "template":
                    outputs = run_template(node, pool)
                elif node.type == "if_else":
                    result = evaluate_if_else(node, pool)
                    outputs, handle = {"result": result}, "true" if result else "false"
                elif node.type == "human_input":
                    raise PauseRequested(list(node.config.get("form", [])))
                else:
                    outputs = run_end(node, pool)
            except PauseRequested as pause:
                yield self._event(
                    "human_input_required",
                    {
                        "node_id": node.id,
                        "title": node.title,
                        "form": pause.form,
                        "workflow_run_id": self.workflow_run_id,
                    },
                )
                self.outcome = EngineOutcome(
                    "paused",
                    steps=steps,
                    state={"node_id": node.id, "variables": pool.values, "steps": steps, "execution_id": execution_id},
                )
                yield self._event(
                    "workflow_paused",
                    {
                        "id": self.workflow_run_id,
                        "paused_node_id": node.id,
                        "reason": "human_input_required",
                        "created_at": now(),
                    },
                )
                return
            except StopRequested as stop:
                yield self._node_finished(node, execution_id, steps, "stopped", None, stop.reason, started)
                yield self._finished("stopped", None, stop.reason, steps)
                return
            except NodeRunError as exc:
                yield self._node_finished(node, execution_id, steps, "failed", None, str(exc), started)
                yield self._finished("failed", None, str(exc), steps)
                return
            pool.set_outputs(node.id, outputs)
            yield self._node_finished(node, execution_id, steps, "succeeded", outputs, None, started)
            if node.type == "end":
                yield self._finished("succeeded", outputs, None, steps)
                return
            node = self.graph.successor(node.id, handle)

    def _node_finished(
        self,
        node: Node,
        execution_id: str,
        index: int,
        status: str,
        outputs: dict[str, Any] | None,
        error: str | None,
        started: float,
    ) -> dict[str, Any]:
        return self._event(
            "node_finished",
            {
                "id": execution_id,
                "node_id": node.id,
                "node_type": node.type,
                "title": node.title,
                "index": index,
                "status": status,
                "outputs": outputs,
                "error": error,
                "elapsed_time": round(time.monotonic() - started, 6),
            },
        )

    def _finished(self, status: str, outputs: dict[str, Any] | None, error: str | None, steps: int) -> dict[str, Any]:
        self.outcome = EngineOutcome(status, outputs=outputs, error=error, steps=steps)
        return finished_event(
            task_id=self.task_id,
            workflow_run_id=self.workflow_run_id,
            app_id=self.app_id,
            status=status,
            outputs=outputs,
            error=error,
            steps=steps,
            created_at=self.created_at,
        )


def finished_event(
    *,
    task_id: str,
    workflow_run_id: str,
    app_id: str,
    status: str,
    outputs: dict[str, Any] | None,
    error: str | None,
    steps: int,
    created_at: float,
    finished_at: float | None = None,
) -> dict[str, Any]:
    """``workflow_finished``; also built by the coordinator, the lease check and the events endpoint."""
    finished = time.time() if finished_at is None else finished_at
    return make_event(
        "workflow_finished",
        task_id=task_id,
        workflow_run_id=workflow_run_id,
        data={
            "id": workflow_run_id,
            "workflow_id": app_id,
            "status": status,
            "outputs": outputs,
            "error": error,
            "elapsed_time": round(max(0.0, finished - created_at), 6),
            "total_steps": steps,
            "created_at": int(created_at),
            "finished_at": int(finished),
        },
    )
