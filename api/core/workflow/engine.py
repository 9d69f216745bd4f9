"""Runs one execution attempt of a workflow run on graphon and yields Dify's events.

An attempt ends in exactly one of: ``workflow_finished`` (succeeded, partial-succeeded, failed or
stopped) or ``workflow_paused`` at a human-input node, after which :attr:`WorkflowEngine.outcome`
holds the state a later attempt resumes from: graphon's own snapshot (``RuntimeState.dumps()``) and
its response filter's, with the format and graphon's version recorded beside them.

A stop reaches graphon through its command channel (an abort, seen by its dispatcher between nodes)
and the model runtime through the run's :class:`StopSignal` (seen between chunks). A consumer that
stops iterating stops the run the same way, and closing the engine's iterator joins its threads: no
node of the run keeps running.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from typing import Any

from graphon.engine import Engine
from graphon.engine.command import CommandChannel
from graphon.engine.filter import EngineEventFilterContext, ResponseStreamFilter, filter_engine_events
from graphon.engine_events import (
    EngineEvent,
    GraphRunAbortedEvent,
    GraphRunFailedEvent,
    GraphRunPartialSucceededEvent,
    GraphRunPausedEvent,
    GraphRunStartedEvent,
    GraphRunSucceededEvent,
    NodeRunFailedEvent,
    NodeRunStartedEvent,
)
from graphon.runtime.runtime_state import RuntimeState
from graphon.runtime.variable_pool import VariablePool

from .commands import StopChannel
from .dsl import build_graph
from .event_mapping import DifyEvents, to_json
from .events import created_by, make_event
from .forms import pause_reason
from .graph import Graph
from .human_input import DEFAULT_FORM_TIMEOUT, FormOpener, HumanInput
from .model_runtime import ModelSettings, StopSignal
from .node_factory import Collaborators

#: The layout of :attr:`EngineOutcome.state` (graphon's snapshots keep their own version inside).
STATE_FORMAT = "graphon"
STATE_FORMAT_VERSION = 1
#: Seconds between two reads of the command channel by the engine itself (graphon's dispatcher reads it
#: every 0.1 s, between nodes only); a stop sent to the channel reaches the model within this.
CHANNEL_POLL_INTERVAL = 0.02
#: What the run says when its consumer went away before its end.
CONSUMER_GONE = "the run's consumer stopped reading"


@dataclasses.dataclass
class EngineOutcome:
    status: str  # succeeded | partial-succeeded | failed | stopped | paused
    outputs: dict[str, Any] | None = None
    error: str | None = None
    #: For ``paused``: what a resumed attempt needs (snapshots, paused node, its form, the counts).
    state: dict[str, Any] | None = None
    steps: int = 0
    #: The model's tokens over the whole run so far (all attempts).
    tokens: int = 0


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a resumed attempt starts: the state saved at the pause and what ended the wait.

    ``submission`` is ``{"kind": "submission", "inputs", "action"}`` for a filled form or
    ``{"kind": "timeout"}`` for one that expired.
    """

    state: Mapping[str, Any]
    submission: Mapping[str, Any]


def graphon_version() -> str:
    return metadata.version("graphon")


class WorkflowEngine:
    def __init__(
        self,
        graph: Mapping[str, Any],
        *,
        app_id: str,
        task_id: str,
        workflow_run_id: str,
        inputs: Mapping[str, Any],
        user: str,
        created_at: float,
        models: ModelSettings | None = None,
        should_stop: Callable[[], str | None] = lambda: None,
        resume: ResumePoint | None = None,
        open_form: FormOpener = lambda node, form: None,
        form_timeout: float = DEFAULT_FORM_TIMEOUT,
        workers: int = 2,
        command_channel: CommandChannel | None = None,
    ) -> None:
        self.graph = dict(graph)
        self.view = Graph(self.graph)
        self.app_id = app_id
        self.task_id = task_id
        self.workflow_run_id = workflow_run_id
        self.inputs = dict(inputs)
        self.user = user
        self.created_at = created_at
        self.models = models or ModelSettings()
        self.should_stop = should_stop
        self.resume = resume
        self.open_form = open_form
        self.form_timeout = form_timeout
        self.workers = workers
        self.command_channel = command_channel
        self.signal = StopSignal()
        self.channel = StopChannel(command_channel, self.signal)
        self._polled = 0.0
        self.outcome: EngineOutcome | None = None
        previous = resume.state if resume is not None else {}
        self.events = DifyEvents(
            task_id,
            workflow_run_id,
            {node.id: node.type for node in self.view.nodes.values()},
            self.view.predecessors(),
            steps=int(previous.get("steps", 0)),
            tokens=int(previous.get("tokens", 0)),
        )

    @property
    def tokens(self) -> int:
        return self.events.tokens

    def _event(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        return make_event(name, task_id=self.task_id, workflow_run_id=self.workflow_run_id, data=data)

    def _system(self) -> dict[str, Any]:
        return {
            "files": [],
            "user_id": self.user,
            "app_id": self.app_id,
            "workflow_id": self.app_id,
            "workflow_run_id": self.workflow_run_id,
        }

    def _started(self, reason: str) -> dict[str, Any]:
        system = {f"sys.{key}": value for key, value in self._system().items()}
        created = self.created_at if reason == "initial" else time.time()
        return self._event(
            "workflow_started",
            {
                "id": self.workflow_run_id,
                "workflow_id": self.app_id,
                "inputs": {**self.inputs, **system},
                "created_at": int(created),
                "reason": reason,
            },
        )

    def _new_state(self) -> RuntimeState | str:
        """A new run's state: its inputs (defaults applied) and system variables; or why it cannot start."""
        pool = VariablePool()
        start = self.view.start
        for key, value in self._system().items():
            pool.add(("sys", key), value)
        for variable in start.config.get("variables", []):
            name = variable["name"]
            if name in self.inputs:
                pool.add((start.id, name), self.inputs[name])
            elif "default" in variable:
                pool.add((start.id, name), variable["default"])
            elif variable.get("required", False):
                return f"input {name!r} is required"
        return RuntimeState(variable_pool=pool, start_at=time.time(), workflow_id=self.app_id)

    def run(self) -> Iterator[dict[str, Any]]:
        previous = self.resume.state if self.resume is not None else None
        if previous is None:
            state = self._new_state()
            if isinstance(state, str):
                yield self._started("initial")
                yield self._finish("failed", None, state)
                return
        elif previous.get("format") != STATE_FORMAT:
            raise RuntimeError("the run was paused by an earlier version of the app, which graphon cannot resume")
        else:
            state = RuntimeState.from_snapshot(str(previous["snapshot"]))
        callback = HumanInput(
            self.view,
            open_form=self.open_form,
            form_timeout=self.form_timeout,
            answer=self.resume.submission if self.resume is not None else None,
            answered_node=previous.get("node_id") if previous else None,
            answered_form=previous.get("form") if previous else None,
        )
        collaborators = Collaborators(self.models, self.signal, callback)
        graph = build_graph(
            self.graph,
            root=self.view.start.id,
            workflow_id=self.app_id,
            runtime_state=state,
            collaborators=collaborators,
        )
        engine = Engine(graph=graph, runtime_state=state, command_channel=self.channel, workers=self.workers)
        responses = ResponseStreamFilter()
        if previous is not None and previous.get("response_filter"):
            responses.loads(str(previous["response_filter"]))
        events = filter_engine_events(
            engine.run(), context=EngineEventFilterContext.from_engine(engine), filters=[responses]
        )
        terminal: EngineEvent | None = None
        try:
            for event in events:
                self._check_stop(engine)
                if isinstance(event, GraphRunStartedEvent):
                    yield self._started(str(event.reason))
                elif isinstance(
                    event,
                    GraphRunSucceededEvent
                    | GraphRunPartialSucceededEvent
                    | GraphRunFailedEvent
                    | GraphRunAbortedEvent
                    | GraphRunPausedEvent,
                ):
                    terminal = event
                else:
                    yield from self._node_event(event, callback)
        except Exception:
            # graphon raises a run's error again after yielding its GraphRunFailedEvent: that event ends the run.
            if not isinstance(terminal, GraphRunFailedEvent):
                raise
        except GeneratorExit:
            # The consumer went away: abort, and let closing graphon's iterator join its threads.
            self.signal.set(CONSUMER_GONE)
            engine.request_abort(CONSUMER_GONE)
            events.close()  # type: ignore[attr-defined]
            raise
        # graphon's iterator is exhausted: its threads are stopped and its state may be dumped.
        yield from self._end(terminal, state, responses, callback)

    def _check_stop(self, engine: Engine) -> None:
        """Between two events: the channel (an abort sent to it), then the run's stop flag."""
        if self.signal.reason is not None:
            return
        now = time.monotonic()
        if now - self._polled >= CHANNEL_POLL_INTERVAL:
            self._polled = now
            self.channel.poll()  # an abort found here reaches graphon with the commands it holds
            if self.signal.reason is not None:
                return
        reason = self.should_stop()
        if reason:
            self.signal.set(reason)
            engine.request_abort(reason)

    def _node_event(self, event: EngineEvent, callback: HumanInput) -> Iterator[dict[str, Any]]:
        # The callback runs on a graphon thread once its node started: its form's event comes right after
        # the node's ``node_started``, before anything graphon flushes ahead of the node's end.
        if not isinstance(event, NodeRunStartedEvent):
            yield from self._form_events(callback)
        for mapped in self.events.map(event):
            if (
                self.signal.reason is not None
                and isinstance(event, NodeRunFailedEvent)
                and mapped["event"] == "node_finished"
            ):
                # The node ended because the run was stopped (the model saw the stop between chunks).
                mapped["data"].update(status="stopped", error=self.signal.reason)
            yield mapped

    def _form_events(self, callback: HumanInput) -> Iterator[dict[str, Any]]:
        if callback.filled is not None:
            filled, callback.filled = callback.filled, None
            yield self._event("human_input_form_filled", to_json(filled))
        if callback.timed_out is not None:
            timed_out, callback.timed_out = callback.timed_out, None
            yield self._event("human_input_form_timeout", timed_out)

    def _end(
        self, terminal: EngineEvent | None, state: RuntimeState, responses: ResponseStreamFilter, callback: HumanInput
    ) -> Iterator[dict[str, Any]]:
        if isinstance(terminal, GraphRunPausedEvent):
            yield from self._pause(state, responses, callback)
        elif self.signal.reason is not None and not isinstance(terminal, GraphRunSucceededEvent):
            yield self._finish("stopped", None, self.signal.reason)
        elif isinstance(terminal, GraphRunSucceededEvent):
            yield self._finish("succeeded", to_json(dict(terminal.outputs)), None)
        elif isinstance(terminal, GraphRunPartialSucceededEvent):
            yield self._finish("partial-succeeded", to_json(dict(terminal.outputs)), None, terminal.exceptions_count)
        elif isinstance(terminal, GraphRunFailedEvent):
            yield self._finish("failed", None, terminal.error, terminal.exceptions_count)
        elif isinstance(terminal, GraphRunAbortedEvent):
            yield self._finish("stopped", None, terminal.reason or "stopped")
        else:
            raise RuntimeError("graphon's run ended without a terminal event")

    def _pause(
        self, state: RuntimeState, responses: ResponseStreamFilter, callback: HumanInput
    ) -> Iterator[dict[str, Any]]:
        """Save both snapshots, then ``human_input_required`` and ``workflow_paused``."""
        if len(callback.opened) != 1:
            raise RuntimeError(f"a run pauses on one form at a time, not {len(callback.opened)}")
        ((node_id, form),) = callback.opened.items()
        snapshot = state.dumps()
        steps, tokens = self.events.steps, self.events.tokens
        self.outcome = EngineOutcome(
            "paused",
            steps=steps,
            tokens=tokens,
            state={
                "format": STATE_FORMAT,
                "format_version": STATE_FORMAT_VERSION,
                "graphon_version": graphon_version(),
                "snapshot_version": json.loads(snapshot).get("version"),
                "snapshot": snapshot,
                "response_filter": responses.dumps(),
                "node_id": node_id,
                "form": form,
                "steps": steps,
                "tokens": tokens,
            },
        )
        yield self._event("human_input_required", form)
        yield self._event(
            "workflow_paused",
            {
                "workflow_run_id": self.workflow_run_id,
                "paused_nodes": [node_id],
                "outputs": {},
                "reasons": [pause_reason(form)],
                "status": "paused",
                "created_at": int(self.created_at),
                "elapsed_time": round(max(0.0, time.time() - self.created_at), 6),
                "total_tokens": tokens,
                "total_steps": steps,
            },
        )

    def _finish(
        self, status: str, outputs: dict[str, Any] | None, error: str | None, exceptions: int = 0
    ) -> dict[str, Any]:
        steps, tokens = self.events.steps, self.events.tokens
        self.outcome = EngineOutcome(status, outputs, error, steps=steps, tokens=tokens)
        event = finished_event(
            task_id=self.task_id,
            workflow_run_id=self.workflow_run_id,
            app_id=self.app_id,
            status=status,
            outputs=outputs,
            error=error,
            steps=steps,
            tokens=tokens,
            created_at=self.created_at,
            user=self.user,
        )
        event["data"]["exceptions_count"] = exceptions
        return event


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
