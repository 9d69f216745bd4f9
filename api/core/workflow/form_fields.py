"""A human-input node's fields and buttons, parsed once into Dify's form input types.

Dify's form inputs are a union on ``type``: ``paragraph`` (text, with an optional default),
``select`` (one of a list of options), ``file`` (one file) and ``file-list`` (several). A graph
declares them as ``"form": [{"name", "type", ...}]``:

- ``paragraph``: ``"default"`` is a string, ``{"type": "constant", "value"}`` or
  ``{"type": "variable", "selector": [node_id, name]}`` (``"node_id.name"`` also reads as a selector).
- ``select``: ``"options": [..]`` or ``"option_source"`` (``{"type": "constant", "value": [..]}`` or
  ``{"type": "variable", "selector": [..]}``, a variable holding a list of strings).
- ``file`` / ``file-list``: ``"allowed_file_types"`` (``image``, ``document``, ``audio``, ``video``,
  ``custom``), ``"allowed_file_extensions"`` (``[".pdf"]``), ``"allowed_file_upload_methods"``
  (``local_file``, ``remote_url``) and, for a list, ``"number_limits"`` (0: no limit).

``"required"`` (default true) is ours: Dify requires every field, we let a graph leave some out.
Graphs written before these types still load: ``text`` is a ``paragraph``, ``number`` a
``paragraph`` too, and ``boolean`` a ``select`` of ``"true"`` / ``"false"``.

A button (``"actions": [{"id", "title", "button_style"?}]``) has Dify's constraints: an identifier
of at most 20 characters, a title of at most 100.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import WorkflowDefinitionError

KINDS = ("paragraph", "select", "file", "file-list")
#: Types of graphs written before Dify's union, and what they are now.
LEGACY_KINDS = {"text": "paragraph", "text-input": "paragraph", "number": "paragraph", "boolean": "select"}
FILE_TYPES = ("image", "document", "audio", "video", "custom")
UPLOAD_METHODS = ("local_file", "remote_url")
BUTTON_STYLES = ("primary", "default", "accent", "ghost")
ACTION_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_ACTION_ID, MAX_ACTION_TITLE = 20, 100
#: The one button of a node that names none.
DEFAULT_ACTIONS: tuple[dict[str, str], ...] = ({"id": "submit", "title": "Submit", "button_style": "primary"},)


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a default or a list of options comes from: a constant, or a variable of the run (``selector``)."""

    kind: str  # "constant" | "variable"
    value: Any = None
    selector: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str
    required: bool = True
    #: ``paragraph``: its default, if it has one.
    default: Source | None = None
    #: ``select``: its options.
    options: Source | None = None
    file_types: tuple[str, ...] = ()
    file_extensions: tuple[str, ...] = ()
    upload_methods: tuple[str, ...] = ()
    number_limits: int = 0


def _fail(node_id: str, message: str) -> WorkflowDefinitionError:
    return WorkflowDefinitionError(f"human_input node {node_id!r}: {message}")


def _selector(node_id: str, name: str, raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = raw.split(".", 1)
    if not isinstance(raw, Sequence) or len(raw) != 2 or not all(isinstance(part, str) and part for part in raw):
        raise _fail(node_id, f"field {name!r}: a selector is [node_id, variable] (or 'node_id.variable')")
    return tuple(raw)


def _source(node_id: str, name: str, raw: Any, *, listed: bool) -> Source:
    if isinstance(raw, Mapping):
        kind = raw.get("type", "constant")
        if kind == "variable":
            return Source("variable", selector=_selector(node_id, name, raw.get("selector")))
        if kind != "constant":
            raise _fail(node_id, f"field {name!r}: a source's type is 'constant' or 'variable', not {kind!r}")
        raw = raw.get("value", [] if listed else "")
    if listed:
        if not isinstance(raw, list) or not raw or not all(isinstance(option, str) for option in raw):
            raise _fail(node_id, f"field {name!r}: a select needs a non-empty list of string options")
        return Source("constant", tuple(raw))
    # Dify's constant defaults are strings: anything else is kept as its JSON text would be.
    return Source("constant", raw if isinstance(raw, str) else _as_text(raw))


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value is not None else ""


def _strings(node_id: str, name: str, raw: Any, key: str, allowed: Sequence[str] | None = None) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise _fail(node_id, f"field {name!r}: {key!r} must be a list of strings")
    if allowed is not None and (unknown := sorted(set(raw) - set(allowed))):
        raise _fail(node_id, f"field {name!r}: {key!r} has {unknown}, not one of {list(allowed)}")
    return tuple(raw)


def parse_field(node_id: str, raw: Any) -> FieldSpec:
    """One ``form`` entry of a human-input node.

    Raises:
        WorkflowDefinitionError: the entry is not a field of one of Dify's types.
    """
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not raw["name"]:
        raise _fail(node_id, "'form' must be a list of {'name': ..., 'type': ...}")
    name, declared = raw["name"], raw.get("type", "paragraph")
    kind = LEGACY_KINDS.get(declared, declared)
    if kind not in KINDS:
        raise _fail(node_id, f"field {name!r} has type {declared!r}, not one of {list(KINDS)}")
    required = bool(raw.get("required", True))
    if kind == "paragraph":
        default = _source(node_id, name, raw["default"], listed=False) if "default" in raw else None
        return FieldSpec(name, kind, required, default=default)
    if kind == "select":
        if declared == "boolean":
            options = Source("constant", ("true", "false"))
        else:
            options = _source(node_id, name, raw.get("option_source", raw.get("options")), listed=True)
        default = _source(node_id, name, raw["default"], listed=False) if "default" in raw else None
        return FieldSpec(name, kind, required, default=default, options=options)
    limits = raw.get("number_limits", 0)
    if isinstance(limits, bool) or not isinstance(limits, int) or limits < 0:
        raise _fail(node_id, f"field {name!r}: 'number_limits' must be a whole number, 0 for no limit")
    file_types = _strings(node_id, name, raw.get("allowed_file_types"), "allowed_file_types", FILE_TYPES)
    extensions = _strings(node_id, name, raw.get("allowed_file_extensions"), "allowed_file_extensions")
    if "custom" in file_types and not extensions:
        raise _fail(node_id, f"field {name!r}: 'custom' file types need 'allowed_file_extensions'")
    methods = _strings(node_id, name, raw.get("allowed_file_upload_methods"), "allowed_file_upload_methods")
    if unknown := sorted(set(methods) - set(UPLOAD_METHODS)):
        raise _fail(node_id, f"field {name!r}: upload methods {unknown} are not one of {list(UPLOAD_METHODS)}")
    return FieldSpec(
        name,
        kind,
        required,
        file_types=file_types,
        file_extensions=tuple(extension.lower() for extension in extensions),
        upload_methods=methods,
        number_limits=limits if kind == "file-list" else 0,
    )


def parse_fields(node_id: str, raw: Any) -> list[FieldSpec]:
    """A human-input node's ``form``.

    Raises:
        WorkflowDefinitionError: not a list of fields, a field is invalid, or two share a name.
    """
    if not isinstance(raw, list):
        raise _fail(node_id, "'form' must be a list of {'name': ..., 'type': ...}")
    fields = [parse_field(node_id, entry) for entry in raw]
    names = [field.name for field in fields]
    if len(set(names)) != len(names):
        raise _fail(node_id, "two fields have the same name")
    return fields


def parse_actions(node_id: str, raw: Any) -> list[dict[str, str]]:
    """A human-input node's buttons: its own ``actions``, or the one default button.

    Raises:
        WorkflowDefinitionError: an action's id, title or style is not one Dify's clients take.
    """
    if raw is None or raw == []:
        return [dict(action) for action in DEFAULT_ACTIONS]
    if not isinstance(raw, list):
        raise _fail(node_id, "'actions' must be a list of {'id', 'title'}")
    actions = []
    for entry in raw:
        action_id = entry.get("id") if isinstance(entry, Mapping) else None
        if not isinstance(action_id, str) or len(action_id) > MAX_ACTION_ID or not ACTION_ID.fullmatch(action_id):
            raise _fail(node_id, f"action id {action_id!r} must be an identifier of at most {MAX_ACTION_ID} characters")
        assert isinstance(entry, Mapping)
        title, style = entry.get("title") or action_id, entry.get("button_style") or "default"
        if not isinstance(title, str) or len(title) > MAX_ACTION_TITLE:
            raise _fail(node_id, f"action {action_id!r}: a title is text of at most {MAX_ACTION_TITLE} characters")
        if style not in BUTTON_STYLES:
            raise _fail(node_id, f"action {action_id!r}: button_style must be one of {list(BUTTON_STYLES)}")
        actions.append({"id": action_id, "title": title, "button_style": style})
    if len({action["id"] for action in actions}) != len(actions):
        raise _fail(node_id, "two actions have the same id")
    return actions
