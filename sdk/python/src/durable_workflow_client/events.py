"""A run's events as typed objects: one dataclass per event the engine emits, and :class:`UnknownEvent`.

Every event keeps what it was built from: :attr:`Event.raw` is the JSON object exactly as the
server sent (and stored) it, and :attr:`Event.id` the resume token that came with it. Fields are
read leniently (a missing one is ``None`` or empty), so a newer server's extra members never break
an older client; an event name this client does not know becomes an :class:`UnknownEvent`.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """Any event of a run."""

    #: The event's name (``"node_started"``, …).
    event: str
    task_id: str
    workflow_run_id: str
    #: The resume token sent with the event (its ``id:``): continue strictly after it with ``after=``.
    id: str | None
    #: The event's JSON object as the server sent it.
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=True)

    @property
    def data(self) -> dict[str, Any]:
        data = self.raw.get("data")
        return data if isinstance(data, dict) else {}


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowStarted(Event):
    inputs: dict[str, Any]
    created_at: int


@dataclasses.dataclass(frozen=True, slots=True)
class NodeStarted(Event):
    #: This execution of the node (a resumed node keeps its id).
    execution_id: str
    node_id: str
    node_type: str
    title: str
    index: int


@dataclasses.dataclass(frozen=True, slots=True)
class TextChunk(Event):
    text: str
    #: ``[node_id, variable]`` the text belongs to.
    from_variable_selector: list[str]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFinished(Event):
    execution_id: str
    node_id: str
    node_type: str
    title: str
    index: int
    #: ``succeeded``, ``failed`` or ``stopped``.
    status: str
    outputs: dict[str, Any] | None
    error: str | None
    elapsed_time: float


@dataclasses.dataclass(frozen=True, slots=True)
class HumanInputRequired(Event):
    node_id: str
    title: str
    #: The fields to submit with ``submit_human_input``: ``[{"name", "type", "required"?}, …]``.
    form: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowPaused(Event):
    paused_node_id: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowFinished(Event):
    #: ``succeeded``, ``failed`` or ``stopped``.
    status: str
    outputs: dict[str, Any] | None
    error: str | None
    elapsed_time: float
    total_steps: int


@dataclasses.dataclass(frozen=True, slots=True)
class UnknownEvent(Event):
    """An event this version of the client has no class for; :attr:`raw` has all of it."""


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    return "" if value is None else str(value)


def _number(data: dict[str, Any], key: str) -> float:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _object(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    return value if isinstance(value, dict) else None


def parse_event(raw: dict[str, Any], event_id: str | None) -> Event:
    """The typed event of ``raw`` (one event's JSON object) received with ``event_id``."""
    name = _text(raw, "event")
    data = raw.get("data")
    d: dict[str, Any] = data if isinstance(data, dict) else {}
    common: dict[str, Any] = {
        "event": name,
        "task_id": _text(raw, "task_id"),
        "workflow_run_id": _text(raw, "workflow_run_id"),
        "id": event_id,
        "raw": raw,
    }
    if name == "workflow_started":
        return WorkflowStarted(**common, inputs=_object(d, "inputs") or {}, created_at=int(_number(d, "created_at")))
    if name in ("node_started", "node_finished"):
        node: dict[str, Any] = {
            "execution_id": _text(d, "id"),
            "node_id": _text(d, "node_id"),
            "node_type": _text(d, "node_type"),
            "title": _text(d, "title"),
            "index": int(_number(d, "index")),
        }
        if name == "node_started":
            return NodeStarted(**common, **node)
        return NodeFinished(
            **common,
            **node,
            status=_text(d, "status"),
            outputs=_object(d, "outputs"),
            error=d.get("error"),
            elapsed_time=_number(d, "elapsed_time"),
        )
    if name == "text_chunk":
        selector = d.get("from_variable_selector")
        return TextChunk(
            **common,
            text=_text(d, "text"),
            from_variable_selector=[str(part) for part in selector] if isinstance(selector, list) else [],
        )
    if name == "human_input_required":
        form = d.get("form")
        return HumanInputRequired(
            **common,
            node_id=_text(d, "node_id"),
            title=_text(d, "title"),
            form=[field for field in form if isinstance(field, dict)] if isinstance(form, list) else [],
        )
    if name == "workflow_paused":
        return WorkflowPaused(**common, paused_node_id=_text(d, "paused_node_id"), reason=_text(d, "reason"))
    if name == "workflow_finished":
        return WorkflowFinished(
            **common,
            status=_text(d, "status"),
            outputs=_object(d, "outputs"),
            error=d.get("error"),
            elapsed_time=_number(d, "elapsed_time"),
            total_steps=int(_number(d, "total_steps")),
        )
    return UnknownEvent(**common)
