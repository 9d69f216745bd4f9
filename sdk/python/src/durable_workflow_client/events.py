"""A run's events as typed objects: one dataclass per event the engine emits, and :class:`UnknownEvent`.

Every event keeps what it was built from: :attr:`Event.raw` is the JSON object exactly as the
server sent (and stored) it, and :attr:`Event.id` the resume token that came with it. Fields are
read leniently (a missing one is ``None`` or empty), so a newer server's extra members never break
an older client; an event name this client does not know becomes an :class:`UnknownEvent`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .forms import FormAction, FormInput, PauseReason, integer, mapping, pause_reasons, request_fields, text


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
    #: ``initial`` (the run's first attempt) or ``resumption``: a resumed run starts again after its
    #: form was submitted or expired, so one run may have several ``workflow_started`` events.
    reason: str


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
    """A human-input node opened a form; submit it with ``submit_form(form_token, …)``."""

    form_id: str
    node_id: str
    node_title: str
    #: Markdown; ``{{#$output.<name>#}}`` marks where a field's value goes.
    form_content: str
    #: The fields: send each under its ``output_variable_name``.
    inputs: list[FormInput]
    #: The buttons; a submission names one by its ``id``.
    actions: list[FormAction]
    display_in_ui: bool
    form_token: str
    resolved_default_values: dict[str, Any]
    #: Unix seconds after which the form no longer accepts a submission.
    expiration_time: int
    #: Where else the form can be answered (Dify: ``console``, ``email``); empty: only by its token.
    approval_channels: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowPaused(Event):
    #: The nodes waiting for input.
    paused_nodes: list[str]
    outputs: dict[str, Any]
    #: One open form per waiting node (each as its ``human_input_required`` announced it).
    reasons: list[PauseReason]
    #: ``paused``.
    status: str
    created_at: int
    elapsed_time: float
    total_tokens: int
    total_steps: int


@dataclasses.dataclass(frozen=True, slots=True)
class HumanInputFormFilled(Event):
    """A form was submitted; the run goes on from its node."""

    node_id: str
    node_title: str
    rendered_content: str
    action_id: str
    action_text: str
    #: The values submitted, by field name.
    submitted_data: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class HumanInputFormTimeout(Event):
    """A form expired unanswered: its node fails, and with it the run."""

    node_id: str
    node_title: str
    expiration_time: int


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowFinished(Event):
    #: ``succeeded``, ``failed`` or ``stopped``.
    status: str
    outputs: dict[str, Any] | None
    error: str | None
    elapsed_time: float
    total_steps: int
    total_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class UnknownEvent(Event):
    """An event this version of the client has no class for; :attr:`raw` has all of it."""


def _number(data: dict[str, Any], key: str) -> float:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


def _strings(value: Any) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _object(data: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    return value if isinstance(value, dict) else None


def parse_event(raw: dict[str, Any], event_id: str | None) -> Event:
    """The typed event of ``raw`` (one event's JSON object) received with ``event_id``."""
    name = text(raw, "event")
    data = raw.get("data")
    d: dict[str, Any] = data if isinstance(data, dict) else {}
    common: dict[str, Any] = {
        "event": name,
        "task_id": text(raw, "task_id"),
        "workflow_run_id": text(raw, "workflow_run_id"),
        "id": event_id,
        "raw": raw,
    }
    if name == "workflow_started":
        return WorkflowStarted(
            **common, inputs=_object(d, "inputs") or {}, created_at=integer(d, "created_at"), reason=text(d, "reason")
        )
    if name in ("node_started", "node_finished"):
        node: dict[str, Any] = {
            "execution_id": text(d, "id"),
            "node_id": text(d, "node_id"),
            "node_type": text(d, "node_type"),
            "title": text(d, "title"),
            "index": integer(d, "index"),
        }
        if name == "node_started":
            return NodeStarted(**common, **node)
        return NodeFinished(
            **common,
            **node,
            status=text(d, "status"),
            outputs=_object(d, "outputs"),
            error=d.get("error"),
            elapsed_time=_number(d, "elapsed_time"),
        )
    if name == "text_chunk":
        return TextChunk(
            **common, text=text(d, "text"), from_variable_selector=_strings(d.get("from_variable_selector"))
        )
    if name == "human_input_required":
        return HumanInputRequired(**common, **request_fields(d))
    if name == "workflow_paused":
        return WorkflowPaused(
            **common,
            paused_nodes=_strings(d.get("paused_nodes")),
            outputs=mapping(d, "outputs"),
            reasons=pause_reasons(d.get("reasons")),
            status=text(d, "status"),
            created_at=integer(d, "created_at"),
            elapsed_time=_number(d, "elapsed_time"),
            total_tokens=integer(d, "total_tokens"),
            total_steps=integer(d, "total_steps"),
        )
    if name == "human_input_form_filled":
        return HumanInputFormFilled(
            **common,
            node_id=text(d, "node_id"),
            node_title=text(d, "node_title"),
            rendered_content=text(d, "rendered_content"),
            action_id=text(d, "action_id"),
            action_text=text(d, "action_text"),
            submitted_data=mapping(d, "submitted_data"),
        )
    if name == "human_input_form_timeout":
        return HumanInputFormTimeout(
            **common,
            node_id=text(d, "node_id"),
            node_title=text(d, "node_title"),
            expiration_time=integer(d, "expiration_time"),
        )
    if name == "workflow_finished":
        return WorkflowFinished(
            **common,
            status=text(d, "status"),
            outputs=_object(d, "outputs"),
            error=d.get("error"),
            elapsed_time=_number(d, "elapsed_time"),
            total_steps=integer(d, "total_steps"),
            total_tokens=integer(d, "total_tokens"),
        )
    return UnknownEvent(**common)
