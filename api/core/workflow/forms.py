"""Human-input forms in the shape Dify's clients know: definitions, submissions and rendered content.

A graph's ``human_input`` node declares its fields (``"form": [{"name", "type", "required"?,
"label"?, "default"?}]``), optionally ``"form_content"`` (markdown in which ``{{#$output.<name>#}}``
marks where a field's value goes), ``"actions"`` (the buttons) and ``"timeout"`` (seconds). This
module turns that into the public form (the ``human_input_required`` event, the form endpoints),
checks a submission against it, and renders the filled content.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from .errors import NodeRunError
from .graph import Node

#: Each node without its own ``actions`` has one button.
DEFAULT_ACTIONS = ({"id": "submit", "title": "Submit", "button_style": "primary"},)
#: How a field's type is shown to clients (Dify's names); the graph's ``text`` is Dify's text input.
_SHOWN_TYPES = {"text": "text-input", "paragraph": "paragraph", "number": "number", "boolean": "boolean"}
_OUTPUT = re.compile(r"\{\{#\$output\.([A-Za-z0-9_\-]+)#\}\}")


class InvalidSubmissionError(NodeRunError):
    """A submission does not match its form: a field is missing or of the wrong type, or the action is unknown."""


@dataclasses.dataclass(frozen=True)
class FormTicket:
    """What makes a form answerable: its id, the secret token clients submit it by, and its end."""

    form_id: str
    form_token: str
    expiration_time: int


def actions_of(node: Node) -> list[dict[str, str]]:
    raw = node.config.get("actions")
    if not isinstance(raw, list) or not raw:
        return [dict(action) for action in DEFAULT_ACTIONS]
    return [
        {
            "id": str(action["id"]),
            "title": str(action.get("title") or action["id"]),
            "button_style": str(action.get("button_style") or "default"),
        }
        for action in raw
        if isinstance(action, Mapping) and action.get("id")
    ]


def input_definitions(node: Node) -> list[dict[str, Any]]:
    """The node's fields as clients see them: ``type``, ``output_variable_name``, ``label``, ``required``."""
    definitions = []
    for field in node.config.get("form", []):
        kind = str(field.get("type", "text"))
        shown: dict[str, Any] = {
            "type": _SHOWN_TYPES.get(kind, kind),
            "output_variable_name": field["name"],
            "label": str(field.get("label") or field["name"]),
            "required": bool(field.get("required", True)),
        }
        if "default" in field:
            shown["default"] = {"type": "constant", "value": field["default"]}
        definitions.append(shown)
    return definitions


def form_content(node: Node) -> str:
    """The form's markdown: the node's own, or its title followed by one placeholder per field."""
    content = node.config.get("form_content")
    if isinstance(content, str):
        return content
    lines = [node.title, ""] + [
        f"{field['name']}: {{{{#$output.{field['name']}#}}}}" for field in node.config.get("form", [])
    ]
    return "\n".join(lines) + "\n"


def default_values(node: Node) -> dict[str, str]:
    """Each field's default, resolved to a string as Dify's clients read them (JSON for a non-string)."""
    return {
        field["name"]: value if isinstance(value := field["default"], str) else json.dumps(value)
        for field in node.config.get("form", [])
        if "default" in field
    }


def public_form(node: Node, ticket: FormTicket) -> dict[str, Any]:
    """The ``human_input_required`` data of ``node`` (also each reason of ``workflow_paused``)."""
    return {
        "form_id": ticket.form_id,
        "node_id": node.id,
        "node_title": node.title,
        "form_content": form_content(node),
        "inputs": input_definitions(node),
        "actions": actions_of(node),
        "display_in_ui": True,
        "form_token": ticket.form_token,
        "resolved_default_values": default_values(node),
        "expiration_time": ticket.expiration_time,
    }


def check_submission(node: Node, inputs: Mapping[str, Any], action: str | None) -> tuple[dict[str, Any], str]:
    """The node's field values from a submission, and the chosen action's id (the first one if ``None``).

    Raises:
        InvalidSubmissionError: A required field is missing, a value has the wrong type, or the action is
            not one of the form's.
    """
    actions = actions_of(node)
    if action is None:
        action = actions[0]["id"]
    if action not in {candidate["id"] for candidate in actions}:
        raise InvalidSubmissionError(f"{action!r} is not one of the form's actions")
    values: dict[str, Any] = {}
    for field in node.config.get("form", []):
        name = field["name"]
        if name not in inputs:
            if "default" in field:
                values[name] = field["default"]
            elif field.get("required", True):
                raise InvalidSubmissionError(f"form field {name!r} is required")
            continue
        value = inputs[name]
        kind = field.get("type", "text")
        if kind == "boolean" and not isinstance(value, bool):
            raise InvalidSubmissionError(f"form field {name!r} must be true or false")
        if kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidSubmissionError(f"form field {name!r} must be a number")
        if kind in ("text", "paragraph") and not isinstance(value, str):
            raise InvalidSubmissionError(f"form field {name!r} must be text")
        values[name] = value
    return values, action


def action_title(node: Node, action: str) -> str:
    return next((candidate["title"] for candidate in actions_of(node) if candidate["id"] == action), action)


def rendered_content(node: Node, values: Mapping[str, Any]) -> str:
    """The form's content with each field's submitted value in its place."""

    def value_of(match: re.Match[str]) -> str:
        value = values.get(match.group(1), "")
        return value if isinstance(value, str) else json.dumps(value)

    return _OUTPUT.sub(value_of, form_content(node))
