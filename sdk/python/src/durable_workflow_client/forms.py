"""Human-input forms as the API describes them: the field definitions, the actions, a pause's reasons.

A paused human-input node is announced by a ``human_input_required`` event and listed again among
the ``reasons`` of ``workflow_paused`` (and of a paused blocking answer); ``GET …/form/human_input/
<form_token>`` returns the form itself. All three share the pieces below. Like the events, they are
read leniently: a missing member is empty, an unknown one is ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class FormInput:
    """One field of a form: what to send under :attr:`output_variable_name` in ``inputs``.

    Dify's form input types: ``paragraph`` (text), ``select`` (one of :attr:`options`), ``file`` (one
    file mapping) and ``file-list`` (a list of them, at most :attr:`number_limits` when that is not 0).
    """

    type: str
    output_variable_name: str
    #: The field's name unless the server sends a label (Dify's forms have none).
    label: str
    #: Dify requires every field; a server may say otherwise.
    required: bool
    #: ``{"type": "constant" | "variable", "value": …}`` when the field has a default, else ``None``.
    default: dict[str, Any] | None
    #: A ``select``'s choices.
    options: list[str] = dataclasses.field(default_factory=list)
    #: A ``file`` or ``file-list``'s limits (empty: any).
    allowed_file_types: list[str] = dataclasses.field(default_factory=list)
    allowed_file_extensions: list[str] = dataclasses.field(default_factory=list)
    allowed_file_upload_methods: list[str] = dataclasses.field(default_factory=list)
    number_limits: int = 0

    @property
    def default_value(self) -> Any:
        """The default's value (``None`` without a default)."""
        return None if self.default is None else self.default.get("value")


@dataclasses.dataclass(frozen=True, slots=True)
class FormAction:
    """A button of a form; submitting names one by its :attr:`id`."""

    id: str
    title: str
    button_style: str


@dataclasses.dataclass(frozen=True, slots=True)
class PauseReason:
    """Why a run is paused: one open form (a ``human_input_required`` payload and its tag, ``TYPE``)."""

    #: ``human_input_required``.
    type: str
    form_id: str
    node_id: str
    node_title: str
    #: Markdown; ``{{#$output.<name>#}}`` marks where a field's value goes.
    form_content: str
    inputs: list[FormInput]
    actions: list[FormAction]
    display_in_ui: bool
    #: What :meth:`~durable_workflow_client.Client.submit_form` takes.
    form_token: str
    resolved_default_values: dict[str, Any]
    #: Unix seconds after which the form no longer accepts a submission.
    expiration_time: int
    #: Where else the form can be answered (Dify: ``console``, ``email``); empty: only by its token.
    approval_channels: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class HumanInputForm:
    """A form as ``GET …/form/human_input/<form_token>`` returns it."""

    form_content: str
    inputs: list[FormInput]
    resolved_default_values: dict[str, Any]
    #: The buttons; submitting without naming one uses the first.
    user_actions: list[FormAction]
    expiration_time: int

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> HumanInputForm:
        return cls(
            form_content=text(body, "form_content"),
            inputs=form_inputs(body.get("inputs")),
            resolved_default_values=mapping(body, "resolved_default_values"),
            user_actions=form_actions(body.get("user_actions")),
            expiration_time=integer(body, "expiration_time"),
        )


def text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    return "" if value is None else str(value)


def integer(data: dict[str, Any], key: str) -> int:
    value = data.get(key)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def mapping(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return dict(value) if isinstance(value, dict) else {}


def _objects(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _strings(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key)
    return [str(item) for item in value] if isinstance(value, list) else []


def form_inputs(value: Any) -> list[FormInput]:
    return [
        FormInput(
            type=text(field, "type"),
            output_variable_name=text(field, "output_variable_name"),
            label=text(field, "label") or text(field, "output_variable_name"),
            required=bool(field.get("required", True)),
            default=field["default"] if isinstance(field.get("default"), dict) else None,
            options=_strings(mapping(field, "option_source"), "value"),
            allowed_file_types=_strings(field, "allowed_file_types"),
            allowed_file_extensions=_strings(field, "allowed_file_extensions"),
            allowed_file_upload_methods=_strings(field, "allowed_file_upload_methods"),
            number_limits=integer(field, "number_limits"),
        )
        for field in _objects(value)
    ]


def form_actions(value: Any) -> list[FormAction]:
    return [
        FormAction(id=text(action, "id"), title=text(action, "title"), button_style=text(action, "button_style"))
        for action in _objects(value)
    ]


def request_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The typed members of a ``human_input_required`` payload (shared by the event and a pause's reasons)."""
    return {
        "form_id": text(data, "form_id"),
        "node_id": text(data, "node_id"),
        "node_title": text(data, "node_title"),
        "form_content": text(data, "form_content"),
        "inputs": form_inputs(data.get("inputs")),
        "actions": form_actions(data.get("actions")),
        "display_in_ui": bool(data.get("display_in_ui", False)),
        "form_token": text(data, "form_token"),
        "resolved_default_values": mapping(data, "resolved_default_values"),
        "expiration_time": integer(data, "expiration_time"),
        "approval_channels": _strings(data, "approval_channels"),
    }


def pause_reasons(value: Any) -> list[PauseReason]:
    # Dify tags its pause reasons ``TYPE``; servers of before that said ``type``.
    return [
        PauseReason(type=text(reason, "TYPE") or text(reason, "type"), **request_fields(reason))
        for reason in _objects(value)
    ]
