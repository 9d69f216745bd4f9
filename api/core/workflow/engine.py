"""Runs a workflow graph and yields its events, one execution attempt at a time.

An attempt ends in exactly one of: ``workflow_finished`` (succeeded, failed or stopped) or
``workflow_paused`` at a human-input node, after which :attr:`WorkflowEngine.outcome` holds the
state a later attempt resumes from. Events carry every field Dify's Workflow App API documents for
them (``docs/dify-compatibility.md``): each node says where the engine came from and what it read,
the simulated model what it spent, and a pause the form that answers it. Node failures end the run as
``failed`` through the normal event path; anything else the engine raises is the caller's to turn
into a failed run.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

from .errors import NodeRunError
from .events import created_by, make_event, now
from .forms import FormTicket, action_title, check_submission, pause_reason, public_form, rendered_content
from .graph import Graph, Node
from .nodes import (
    LlmResult,
    StopRequested,
    evaluate_if_else,
    node_inputs,
    run_end,
    run_llm,
    run_start,
    run_template,
)
from .variables import VariablePool

#: How long a form waits for its answer when its node sets no ``timeout`` (Dify's default: 3 days).
DEFAULT_FORM_TIMEOUT = 3 * 24 * 3600.0
FORM_EXPIRED = "the human input form expired"


@dataclasses.dataclass
class EngineOutcome:
    status: str  # succeeded | failed | stopped | paused
    outputs: dict[str, Any] | None = None
    error: str | None = None
    #: For ``paused``: what a resumed attempt needs (paused node, variable pool, step count, its form).
    state: dict[str, Any] | None = None
    steps: int = 0
    #: The simulated model's tokens over the whole run so far (all attempts).
    tokens: int = 0


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a resumed attempt starts: the state saved at the pause and what ended the wait.

    ``submission`` is ``{"kind": "submission", "inputs", "action"}`` for a filled form or
    ``{"kind": "timeout"}`` for one that expired; a mapping without ``kind`` is a form's inputs as
    task messages queued by earlier versions carry them.
    """

    state: Mapping[str, Any]
    submission: Mapping[str, Any]


#: Makes a paused node's form answerable by its token (stores it) before any client can see the token.
FormOpener = Callable[[Node, Mapping[str, Any]], None]


def new_ticket(expiration_time: int) -> FormTicket:
    """A form's id and its token: 128 random bits, 22 URL-safe characters, never beginning with ``-``.

    A token is pasted into shells and command lines, where a leading ``-`` reads as an option.
    """
    token = secrets.token_urlsafe(16)
    while token.startswith("-"):
        token = secrets.token_urlsafe(16)
    return FormTicket(str(uuid.uuid4()), token, expiration_time)


@dataclasses.dataclass
class _Step:
    """One node's execution: what its ``node_started`` said, kept for its ``node_finished``."""

    node: Node
    execution_id: str
    index: int
    predecessor: str | None
    inputs: dict[str, Any] | None
    created_at: int
    started: float = dataclasses.field(default_factory=time.monotonic)

    def fields(self) -> dict[str, Any]:
        """What ``node_started`` and ``node_finished`` both say of the execution."""
        return {
            "id": self.execution_id,
            "node_id": self.node.id,
            "node_type": self.node.type,
            "title": self.node.title,
            "index": self.index,
            "predecessor_node_id": self.predecessor,
            "inputs": self.inputs,
            # Dify marks values it cut short for the stream; this engine never cuts one.
            "inputs_truncated": False,
        }


#: Dify's iteration and loop containers; this engine's graphs have none.
_NO_LOOP = {"iteration_id": None, "loop_id": None}


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
        open_form: FormOpener = lambda node, form: None,
        form_timeout: float = DEFAULT_FORM_TIMEOUT,
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
        self.open_form = open_form
        self.form_timeout = form_timeout
        self.outcome: EngineOutcome | None = None
        self.tokens = 0

    def _event(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        return make_event(name, task_id=self.task_id, workflow_run_id=self.workflow_run_id, data=data)

    def _started(self, reason: str, created_at: float) -> dict[str, Any]:
        system = {
            "sys.files": [],
            "sys.user_id": self.user,
            "sys.app_id": self.app_id,
            "sys.workflow_id": self.app_id,
            "sys.workflow_run_id": self.workflow_run_id,
        }
        return self._event(
            "workflow_started",
            {
                "id": self.workflow_run_id,
                "workflow_id": self.app_id,
                "inputs": {**self.inputs, **system},
                "created_at": int(created_at),
                "reason": reason,
            },
        )

    def run(self) -> Iterator[dict[str, Any]]:
        steps = 0
        predecessor: str | None = None
        if self.resume is None:
            pool = VariablePool({"sys": {"user": self.user, "workflow_run_id": self.workflow_run_id}})
            node: Node | None = self.graph.start
            yield self._started("initial", self.created_at)
        else:
            state = self.resume.state
            pool = VariablePool({key: dict(value) for key, value in state["variables"].items()})
            steps = int(state["steps"])
            self.tokens = int(state.get("tokens", 0))
            paused = self.graph.nodes[state["node_id"]]
            yield self._started("resumption", time.time())
            step = _Step(
                paused,
                str(state.get("execution_id") or uuid.uuid4()),
                steps,
                state.get("predecessor"),
                {},
                now(),
            )
            yield self._node_started(step)
            answered = yield from self._answer(step, state.get("form") or {}, pool)
            if not answered:
                return
            predecessor = paused.id
            node = self.graph.successor(paused.id)

        while node is not None:
            reason = self.should_stop()
            if reason:
                yield self._finished("stopped", None, reason, steps)
                return
            steps += 1
            step = _Step(node, str(uuid.uuid4()), steps, predecessor, node_inputs(node, pool, self.inputs), now())
            yield self._node_started(step)
            handle: str | None = None
            process_data: dict[str, Any] | None = {}
            metadata: dict[str, Any] | None = None
            try:
                if node.type == "start":
                    outputs = run_start(node, pool, self.inputs)
                elif node.type == "llm":
                    runner = run_llm(node, pool, self.token_delay, self.should_stop)
                    while True:
                        try:
                            token = next(runner)
                        except StopIteration as done:
                            result: LlmResult = done.value
                            break
                        yield self._event("text_chunk", {"text": token, "from_variable_selector": [node.id, "text"]})
                    outputs = result.outputs
                    self.tokens += result.total_tokens
                    # The split of the tokens is the model's usage, which Dify reports in the process
                    # data: its execution metadata takes only its own keys (total tokens, price, currency).
                    usage = {
                        "prompt_tokens": result.prompt_tokens,
                        "completion_tokens": result.completion_tokens,
                        "total_tokens": result.total_tokens,
                    }
                    process_data = {
                        "model_mode": "chat",
                        "prompts": [{"role": "user", "text": result.prompt}],
                        "usage": usage,
                    }
                    metadata = {"total_tokens": result.total_tokens, "total_price": 0, "currency": "USD"}
                elif node.type == "template":
                    outputs = run_template(node, pool)
                elif node.type == "if_else":
                    result_ = evaluate_if_else(node, pool)
                    outputs, handle = {"result": result_}, "true" if result_ else "false"
                elif node.type == "human_input":
                    yield from self._pause(step, pool)
                    return
                else:
                    outputs = run_end(node, pool)
            except StopRequested as stop:
                yield self._node_finished(step, "stopped", None, stop.reason)
                yield self._finished("stopped", None, stop.reason, steps)
                return
            except NodeRunError as exc:
                yield self._node_finished(step, "failed", None, str(exc))
                yield self._finished("failed", None, str(exc), steps)
                return
            pool.set_outputs(node.id, outputs)
            yield self._node_finished(step, "succeeded", outputs, None, process_data=process_data, metadata=metadata)
            if node.type == "end":
                yield self._finished("succeeded", outputs, None, steps)
                return
            predecessor = node.id
            node = self.graph.successor(node.id, handle)

    def _pause(self, step: _Step, pool: VariablePool) -> Iterator[dict[str, Any]]:
        """Open the node's form and pause: ``human_input_required``, then ``workflow_paused``."""
        node = step.node
        timeout = float(node.config.get("timeout") or self.form_timeout)
        form = public_form(node, new_ticket(int(time.time() + timeout)), pool)
        self.open_form(node, form)
        self.outcome = EngineOutcome(
            "paused",
            steps=step.index,
            tokens=self.tokens,
            state={
                "node_id": node.id,
                "variables": pool.values,
                "steps": step.index,
                "execution_id": step.execution_id,
                "predecessor": step.predecessor,
                "tokens": self.tokens,
                "form": form,
            },
        )
        yield self._event("human_input_required", form)
        yield self._event(
            "workflow_paused",
            {
                "workflow_run_id": self.workflow_run_id,
                "paused_nodes": [node.id],
                "outputs": {},
                "reasons": [pause_reason(form)],
                "status": "paused",
                "created_at": int(self.created_at),
                "elapsed_time": round(max(0.0, time.time() - self.created_at), 6),
                "total_tokens": self.tokens,
                "total_steps": step.index,
            },
        )

    def _answer(
        self, step: _Step, form: Mapping[str, Any], pool: VariablePool
    ) -> Generator[dict[str, Any], None, bool]:
        """What ended the paused node's wait: its filled form, or its expiry. Returns whether the run goes on."""
        assert self.resume is not None
        node, submission = step.node, self.resume.submission
        if submission.get("kind") == "timeout":
            yield self._event(
                "human_input_form_timeout",
                {"node_id": node.id, "node_title": node.title, "expiration_time": form.get("expiration_time")},
            )
            yield self._node_finished(step, "failed", None, FORM_EXPIRED)
            yield self._finished("failed", None, FORM_EXPIRED, step.index)
            return False
        if "kind" in submission:
            inputs, action = submission.get("inputs") or {}, submission.get("action")
        else:
            inputs, action = submission, None
        try:
            values, action = check_submission(node, inputs, action, form)
        except NodeRunError as exc:
            yield self._node_finished(step, "failed", None, str(exc))
            yield self._finished("failed", None, str(exc), step.index)
            return False
        content = rendered_content(node, values)
        yield self._event(
            "human_input_form_filled",
            {
                "node_id": node.id,
                "node_title": node.title,
                "rendered_content": content,
                "action_id": action,
                "action_text": action_title(node, action),
                "submitted_data": values,
            },
        )
        outputs = {**values, "__action_id": action, "__rendered_content": content}
        pool.set_outputs(node.id, outputs)
        yield self._node_finished(step, "succeeded", outputs, None)
        return True

    def _node_started(self, step: _Step) -> dict[str, Any]:
        data = {**step.fields(), "created_at": step.created_at, "extras": {}, **_NO_LOOP, "agent_strategy": None}
        return self._event("node_started", data)

    def _node_finished(
        self,
        step: _Step,
        status: str,
        outputs: dict[str, Any] | None,
        error: str | None,
        *,
        process_data: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self._event(
            "node_finished",
            {
                **step.fields(),
                "process_data": {} if process_data is None else process_data,
                "process_data_truncated": False,
                "outputs": outputs,
                "outputs_truncated": False,
                "status": status,
                "error": error,
                "elapsed_time": round(time.monotonic() - step.started, 6),
                "execution_metadata": metadata,
                "created_at": step.created_at,
                "finished_at": now(),
                "files": [],
                **_NO_LOOP,
            },
        )

    def _finished(self, status: str, outputs: dict[str, Any] | None, error: str | None, steps: int) -> dict[str, Any]:
        self.outcome = EngineOutcome(status, outputs=outputs, error=error, steps=steps, tokens=self.tokens)
        return finished_event(
            task_id=self.task_id,
            workflow_run_id=self.workflow_run_id,
            app_id=self.app_id,
            status=status,
            outputs=outputs,
            error=error,
            steps=steps,
            tokens=self.tokens,
            created_at=self.created_at,
            user=self.user,
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
    tokens: int = 0,
    user: str | None = None,
) -> dict[str, Any]:
    """``workflow_finished``; also built by the coordinator, the lease check and the events endpoint.

    ``user`` is the run's end user, named in ``created_by`` (``{}`` where it is not known).
    """
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
            "total_tokens": tokens,
            "total_steps": steps,
            "created_at": int(created_at),
            "finished_at": int(finished),
            "created_by": {} if user is None else created_by(app_id, user),
            "exceptions_count": 0,
            "files": [],
        },
    )
