"""graphon's engine events as Dify's stream responses (``api/core/app/entities/task_entities.py``).

One :class:`DifyEvents` per attempt turns each event graphon yields (after its response-stream filter,
so only text that reaches an end or answer node streams) into zero or more of the app's events
``{"event", "task_id", "workflow_run_id", "data"}`` with the fields of Dify's models: node, iteration,
loop, retry and text events here; the run's own start, pause and end are the engine's (it knows the
run's totals and its form). Edge and agent-log events have no Dify stream response: they are dropped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from graphon.engine_events import (
    EngineEvent,
    NodeEvent,
    NodeRunExceptionEvent,
    NodeRunFailedEvent,
    NodeRunIterationFailedEvent,
    NodeRunIterationNextEvent,
    NodeRunIterationStartedEvent,
    NodeRunIterationSucceededEvent,
    NodeRunLoopFailedEvent,
    NodeRunLoopNextEvent,
    NodeRunLoopStartedEvent,
    NodeRunLoopSucceededEvent,
    NodeRunRetryEvent,
    NodeRunStartedEvent,
    NodeRunStreamChunkEvent,
    NodeRunSucceededEvent,
)
from graphon.workflow_type_encoder import WorkflowRuntimeTypeConverter

from .events import make_event

#: ``WorkflowNodeExecutionMetadataKey`` values Dify's stream models take in ``execution_metadata``.
DIFY_METADATA_KEYS = frozenset(
    {
        "total_tokens", "total_price", "currency", "tool_info", "agent_log", "iteration_id", "iteration_index",
        "loop_id", "loop_index", "parallel_id", "parallel_start_node_id", "parent_parallel_id",
        "parent_parallel_start_node_id", "parallel_mode_run_id", "iteration_duration_map", "loop_duration_map",
        "error_strategy", "loop_variable_map",
    }
)  # fmt: skip
_ENCODER = WorkflowRuntimeTypeConverter()


def to_json(value: Any) -> Any:
    return _ENCODER.value_to_json_encodable_recursive(value)


def _timestamp(moment: datetime | None) -> int:
    if moment is None:
        return int(time.time())
    return int(moment.replace(tzinfo=UTC).timestamp() if moment.tzinfo is None else moment.timestamp())


@dataclasses.dataclass
class _Started:
    """What a node's ``node_started`` said, kept for its ``node_finished``."""

    index: int
    predecessor: str | None
    created_at: int
    started: float
    iteration_id: str | None
    loop_id: str | None


@dataclasses.dataclass
class DifyEvents:
    task_id: str
    workflow_run_id: str
    #: Node types of the graph (nested ones included), to tell a node's container apart.
    node_types: Mapping[str, str]
    #: A node's one way in, where it has one (graphon names no predecessor in its events).
    predecessors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Steps before this attempt (a resumed run goes on counting).
    steps: int = 0
    tokens: int = 0
    _started: dict[str, _Started] = dataclasses.field(default_factory=dict)
    _titles: dict[str, str] = dataclasses.field(default_factory=dict)

    def _event(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        return make_event(name, task_id=self.task_id, workflow_run_id=self.workflow_run_id, data=data)

    def _containers(self, event: EngineEvent) -> tuple[str | None, str | None]:
        container = event.container_id or None
        kind = self.node_types.get(container or "")
        return (container if kind == "iteration" else None, container if kind == "loop" else None)

    def map(self, event: EngineEvent) -> list[dict[str, Any]]:
        """Dify's events for one of graphon's (none for the run-level ones: the engine makes those)."""
        match event:
            case NodeRunRetryEvent():
                return [self._retry(event)]
            case NodeRunStartedEvent():
                return [self._node_started(event)]
            case NodeRunSucceededEvent():
                return [self._node_finished(event, "succeeded", None)]
            case NodeRunFailedEvent():
                return [self._node_finished(event, "failed", event.error)]
            case NodeRunExceptionEvent():
                return [self._node_finished(event, "exception", event.error)]
            case NodeRunStreamChunkEvent():
                if not event.chunk:  # graphon's end-of-stream marker: Dify sends no empty chunk
                    return []
                return [
                    self._event("text_chunk", {"text": event.chunk, "from_variable_selector": list(event.selector)})
                ]
            case NodeRunIterationStartedEvent() | NodeRunLoopStartedEvent():
                return [self._container_started(event)]
            case NodeRunIterationNextEvent() | NodeRunLoopNextEvent():
                return [self._container_next(event)]
            case (
                NodeRunIterationSucceededEvent()
                | NodeRunIterationFailedEvent()
                | NodeRunLoopSucceededEvent()
                | NodeRunLoopFailedEvent()
            ):
                return [self._container_completed(event)]
        return []

    def _fields(self, event: NodeEvent, title: str, started: _Started) -> dict[str, Any]:
        return {
            "id": event.id,
            "node_id": event.node_id,
            "node_type": str(event.node_type),
            "title": title,
            "index": started.index,
            "predecessor_node_id": started.predecessor,
            "inputs": to_json(dict(event.node_run_result.inputs)) or None,
            "inputs_truncated": False,
        }

    def _node_started(self, event: NodeRunStartedEvent) -> dict[str, Any]:
        self.steps += 1
        iteration_id, loop_id = self._containers(event)
        started = _Started(
            self.steps,
            event.predecessor_node_id or self.predecessors.get(event.node_id),
            _timestamp(event.start_at),
            time.monotonic(),
            iteration_id,
            loop_id,
        )
        self._started[event.id] = started
        self._titles[event.id] = event.node_title
        data = {
            **self._fields(event, event.node_title, started),
            "inputs": None,
            "created_at": started.created_at,
            "extras": dict(event.extras),
            "iteration_id": iteration_id,
            "loop_id": loop_id,
            "agent_strategy": None,
        }
        return self._event("node_started", data)

    def started_index(self, execution_id: str) -> int | None:
        started = self._started.get(execution_id)
        return None if started is None else started.index

    def _finished_data(self, event: NodeEvent, status: str, error: str | None) -> dict[str, Any]:
        started = self._started.get(event.id) or _Started(
            self.steps, None, int(time.time()), time.monotonic(), None, None
        )
        iteration_id, loop_id = started.iteration_id, started.loop_id
        result = event.node_run_result
        usage_tokens = int(result.llm_usage.total_tokens or 0)
        metadata = {str(key): value for key, value in result.metadata.items() if str(key) in DIFY_METADATA_KEYS}
        if usage_tokens:
            self.tokens += usage_tokens
            metadata.setdefault("total_tokens", usage_tokens)
            metadata.setdefault("total_price", 0)
            metadata.setdefault("currency", "USD")
        return {
            **self._fields(event, self._titles.get(event.id, event.node_id), started),
            "process_data": to_json(dict(result.process_data)),
            "process_data_truncated": False,
            "outputs": to_json(dict(result.outputs)) if status != "failed" else None,
            "outputs_truncated": False,
            "status": status,
            "error": error,
            "elapsed_time": round(time.monotonic() - started.started, 6),
            "execution_metadata": to_json(metadata) or None,
            "created_at": started.created_at,
            "finished_at": int(time.time()),
            "files": [],
            "iteration_id": iteration_id,
            "loop_id": loop_id,
        }

    def _node_finished(self, event: NodeEvent, status: str, error: str | None) -> dict[str, Any]:
        return self._event("node_finished", self._finished_data(event, status, error))

    def _retry(self, event: NodeRunRetryEvent) -> dict[str, Any]:
        self._titles.setdefault(event.id, event.node_title)
        data = {**self._finished_data(event, "retry", event.error), "retry_index": event.retry_index}
        return self._event("node_retry", data)

    def _container_started(self, event: NodeRunIterationStartedEvent | NodeRunLoopStartedEvent) -> dict[str, Any]:
        name = "iteration_started" if isinstance(event, NodeRunIterationStartedEvent) else "loop_started"
        self._titles.setdefault(event.id, event.node_title)
        return self._event(
            name,
            {
                "id": event.id,
                "node_id": event.node_id,
                "node_type": str(event.node_type),
                "title": event.node_title,
                "created_at": _timestamp(event.start_at),
                "extras": {},
                "metadata": to_json(dict(event.metadata)),
                "inputs": to_json(dict(event.inputs)),
                "inputs_truncated": False,
            },
        )

    def _container_next(self, event: NodeRunIterationNextEvent | NodeRunLoopNextEvent) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": event.id,
            "node_id": event.node_id,
            "node_type": str(event.node_type),
            "title": event.node_title,
            "index": event.index,
            "created_at": int(time.time()),
            "extras": {},
        }
        if isinstance(event, NodeRunLoopNextEvent):
            data["pre_loop_output"] = to_json(event.pre_loop_output)
            return self._event("loop_next", data)
        return self._event("iteration_next", data)

    def _container_completed(
        self,
        event: NodeRunIterationSucceededEvent
        | NodeRunIterationFailedEvent
        | NodeRunLoopSucceededEvent
        | NodeRunLoopFailedEvent,
    ) -> dict[str, Any]:
        failed = isinstance(event, NodeRunIterationFailedEvent | NodeRunLoopFailedEvent)
        loop = isinstance(event, NodeRunLoopSucceededEvent | NodeRunLoopFailedEvent)
        created = _timestamp(event.start_at)
        metadata = {str(key): value for key, value in event.metadata.items() if str(key) in DIFY_METADATA_KEYS}
        return self._event(
            "loop_completed" if loop else "iteration_completed",
            {
                "id": event.id,
                "node_id": event.node_id,
                "node_type": str(event.node_type),
                "title": event.node_title,
                "outputs": to_json(dict(event.outputs)),
                "outputs_truncated": False,
                "created_at": created,
                "extras": {},
                "inputs": to_json(dict(event.inputs)),
                "inputs_truncated": False,
                "status": "failed" if failed else "succeeded",
                "error": event.error
                if isinstance(event, NodeRunIterationFailedEvent | NodeRunLoopFailedEvent)
                else None,
                "elapsed_time": round(max(0.0, time.time() - created), 6),
                "total_tokens": int(str(metadata.get("total_tokens") or 0)),
                "execution_metadata": to_json(metadata),
                "finished_at": int(time.time()),
                "steps": event.steps,
            },
        )
