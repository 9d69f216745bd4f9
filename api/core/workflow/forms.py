"""Human-input forms in the shape Dify's clients know: definitions, submissions and rendered content.

A graph's ``human_input`` node declares its fields in Dify's form input types (``form_fields``),
optionally ``"form_content"`` (markdown in which ``{{#$output.<name>#}}`` marks where a field's value
goes), ``"actions"`` (the buttons) and ``"timeout"`` (seconds). This module turns that into the public
form (the ``human_input_required`` event, each reason of ``workflow_paused``, the form endpoints),
checks a submission against it, and renders the filled content.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .errors import NodeRunError
from .form_fields import UPLOAD_METHODS, FieldSpec, Source, parse_actions, parse_fields
from .graph import Node
from .variables import VariablePool

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
    return parse_actions(node.id, node.config.get("actions"))


def fields_of(node: Node) -> list[FieldSpec]:
    return parse_fields(node.id, node.config.get("form", []))


def _resolve(source: Source, pool: VariablePool | None) -> Any:
    if source.kind == "constant":
        return source.value
    if pool is None:
        return None
    try:
        return pool.get(".".join(source.selector))
    except NodeRunError:
        return None


def _options(field: FieldSpec, pool: VariablePool | None) -> list[str]:
    """A select's options, a variable's resolved now.

    Raises:
        NodeRunError: the variable holds no list of strings.
    """
    assert field.options is not None
    value = _resolve(field.options, pool)
    if not isinstance(value, list | tuple) or not all(isinstance(option, str) for option in value):
        selector = ".".join(field.options.selector)
        raise NodeRunError(f"the options of form field {field.name!r} ({selector}) are not a list of strings")
    return list(value)


def _source_dump(source: Source | None, value: Any) -> dict[str, Any] | None:
    """A source as Dify dumps it: every member, the value resolved."""
    if source is None:
        return None
    return {"type": source.kind, "selector": list(source.selector), "value": value}


def input_definition(field: FieldSpec, pool: VariablePool | None) -> dict[str, Any]:
    """One field as Dify's form input union dumps it (``FormInputConfig``)."""
    shown: dict[str, Any] = {"output_variable_name": field.name, "type": field.kind}
    if field.kind == "paragraph":
        default = field.default
        shown["default"] = _source_dump(default, default.value if default and default.kind == "constant" else "")
    elif field.kind == "select":
        shown["option_source"] = _source_dump(field.options, _options(field, pool))
    else:
        shown["allowed_file_types"] = list(field.file_types)
        shown["allowed_file_extensions"] = list(field.file_extensions)
        shown["allowed_file_upload_methods"] = list(field.upload_methods)
        if field.kind == "file-list":
            shown["number_limits"] = field.number_limits
    return shown


def input_definitions(node: Node, pool: VariablePool | None = None) -> list[dict[str, Any]]:
    """The node's fields as clients see them (their variable sources resolved from ``pool``).

    Raises:
        NodeRunError: a select's options variable holds no list of strings.
    """
    return [input_definition(field, pool) for field in fields_of(node)]


def form_content(node: Node) -> str:
    """The form's markdown: the node's own, or its title followed by one placeholder per field."""
    content = node.config.get("form_content")
    if isinstance(content, str):
        return content
    lines = [node.title, ""] + [f"{field.name}: {{{{#$output.{field.name}#}}}}" for field in fields_of(node)]
    return "\n".join(lines) + "\n"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def default_values(node: Node, pool: VariablePool | None = None) -> dict[str, str]:
    """Each field's default, resolved and as text (Dify's ``resolved_default_values``)."""
    values = {}
    for field in fields_of(node):
        if field.default is not None and (value := _resolve(field.default, pool)) is not None:
            values[field.name] = _text(value)
    return values


def public_form(node: Node, ticket: FormTicket, pool: VariablePool | None = None) -> dict[str, Any]:
    """The ``human_input_required`` data of ``node`` (also each reason of ``workflow_paused``).

    ``approval_channels`` names where else the form can be answered (Dify: a console, email): here
    only by its token, so none.

    Raises:
        NodeRunError: a select's options variable holds no list of strings.
    """
    return {
        "form_id": ticket.form_id,
        "node_id": node.id,
        "node_title": node.title,
        "form_content": form_content(node),
        "inputs": input_definitions(node, pool),
        "actions": actions_of(node),
        "display_in_ui": True,
        "form_token": ticket.form_token,
        "resolved_default_values": default_values(node, pool),
        "expiration_time": ticket.expiration_time,
        "approval_channels": [],
    }


def pause_reason(form: Mapping[str, Any]) -> dict[str, Any]:
    """A ``workflow_paused`` reason: the form, tagged as Dify tags its pause reasons (``TYPE``)."""
    return {"TYPE": "human_input_required", **form}


def _shown_options(form: Mapping[str, Any], name: str) -> list[str] | None:
    """The options a form showed for field ``name`` (forms of earlier versions show none)."""
    for shown in form.get("inputs") or ():
        if isinstance(shown, Mapping) and shown.get("output_variable_name") == name:
            source = shown.get("option_source")
            if isinstance(source, Mapping) and isinstance(source.get("value"), list):
                return [str(option) for option in source["value"]]
    return None


def _extension(value: Mapping[str, Any]) -> str:
    extension = value.get("extension")
    if not isinstance(extension, str) or not extension:
        name = value.get("filename") or urllib.parse.urlsplit(str(value.get("url") or "")).path
        extension = posixpath.splitext(str(name))[1]
    extension = extension.lower()
    return extension if not extension or extension.startswith(".") else f".{extension}"


def check_file(name: str, value: Any, field: FieldSpec) -> dict[str, Any]:
    """A file value (Dify's ``{"type", "transfer_method", "upload_file_id" | "url"}``) that ``field`` takes.

    Raises:
        InvalidSubmissionError: not a file mapping, or one the field's settings do not allow.
    """
    if not isinstance(value, Mapping):
        raise InvalidSubmissionError(f"form field {name!r} must be a file object")
    method = value.get("transfer_method")
    allowed = field.upload_methods or UPLOAD_METHODS
    if method not in allowed:
        raise InvalidSubmissionError(f"form field {name!r}: transfer_method must be one of {list(allowed)}")
    if method == "local_file" and not (isinstance(value.get("upload_file_id"), str) and value["upload_file_id"]):
        raise InvalidSubmissionError(f"form field {name!r}: a local_file needs its upload_file_id")
    if method == "remote_url":
        url = value.get("url")
        if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise InvalidSubmissionError(f"form field {name!r}: a remote_url needs an http(s) url")
    kind = value.get("type")
    if kind is not None and field.file_types and kind not in field.file_types:
        raise InvalidSubmissionError(f"form field {name!r}: files of type {kind!r} are not allowed here")
    if field.file_extensions and _extension(value) not in field.file_extensions:
        raise InvalidSubmissionError(f"form field {name!r}: only {list(field.file_extensions)} files are allowed")
    return dict(value)


#: The longest text a form field takes, in characters: an answer travels in the run's task message and its
#: events, and a form is for a person's answer, not a document (files are uploads).
MAX_FIELD_TEXT = 65_536


def _check_value(field: FieldSpec, value: Any, form: Mapping[str, Any]) -> Any:
    name = field.name
    if field.kind == "paragraph":
        if not isinstance(value, str):
            raise InvalidSubmissionError(f"form field {name!r} must be text")
        if len(value) > MAX_FIELD_TEXT:
            raise InvalidSubmissionError(f"form field {name!r} is longer than {MAX_FIELD_TEXT} characters")
        return value
    if field.kind == "select":
        options = _shown_options(form, name)
        if options is None and field.options is not None and field.options.kind == "constant":
            options = list(field.options.value)
        if not isinstance(value, str) or (options is not None and value not in options):
            raise InvalidSubmissionError(f"form field {name!r} must be one of {options}")
        return value
    if field.kind == "file":
        return check_file(name, value, field)
    if not isinstance(value, list):
        raise InvalidSubmissionError(f"form field {name!r} must be a list of file objects")
    if field.number_limits and len(value) > field.number_limits:
        raise InvalidSubmissionError(f"form field {name!r} takes at most {field.number_limits} files")
    return [check_file(name, item, field) for item in value]


def check_submission(
    node: Node, inputs: Mapping[str, Any], action: str | None, form: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """The node's field values from a submission, and the chosen action's id (the first one if ``None``).

    ``form`` is the form as it was shown (its options and defaults resolved then).

    Raises:
        InvalidSubmissionError: A required field is missing, a value has the wrong type or is too long, or the
            action is not one of the form's.
    """
    shown = form or {}
    actions = actions_of(node)
    if action is None:
        action = actions[0]["id"]
    if action not in {candidate["id"] for candidate in actions}:
        raise InvalidSubmissionError(f"{action!r} is not one of the form's actions")
    defaults = shown.get("resolved_default_values")
    if not isinstance(defaults, Mapping):
        defaults = default_values(node)
    values: dict[str, Any] = {}
    for field in fields_of(node):
        if field.name not in inputs:
            if field.name in defaults:
                values[field.name] = defaults[field.name]
            elif field.required:
                raise InvalidSubmissionError(f"form field {field.name!r} is required")
            continue
        values[field.name] = _check_value(field, inputs[field.name], shown)
    return values, action


def action_title(node: Node, action: str) -> str:
    return next((candidate["title"] for candidate in actions_of(node) if candidate["id"] == action), action)


def rendered_content(node: Node, values: Mapping[str, Any]) -> str:
    """The form's content with each field's submitted value in its place (a file as ``[file]``, as Dify shows it)."""
    kinds = {field.name: field.kind for field in fields_of(node)}

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        value = values.get(name, "")
        if kinds.get(name) == "file":
            return "[file]" if value else ""
        if kinds.get(name) == "file-list":
            return f"[{len(value) if isinstance(value, list) else 0} files]"
        return _text(value)

    return _OUTPUT.sub(value_of, form_content(node))
