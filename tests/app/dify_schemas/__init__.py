"""JSON Schemas (draft 2020-12) of what a Dify client receives from the workflow API, and a validator.

The schemas are written from Dify's published *Workflow App API* reference and our own
``docs/dify-compatibility.md``: every documented field is required with its documented type, and
extra fields are allowed because Dify keeps adding some. ``common.json`` holds the shared parts;
the others refer to it by relative ``$ref``, resolved here from this directory (never fetched: the
``.invalid`` host of the ``$id``\\s does not exist).
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

__all__ = [
    "EVENT_NAMES",
    "SCHEMA_DIR",
    "load_schema",
    "registry",
    "schema_names",
    "validate",
    "validate_event",
    "validator",
]

SCHEMA_DIR = pathlib.Path(__file__).parent
BASE_URI = "https://dify-schemas.invalid/"

#: The events a workflow stream may carry, each with its schema ``event_<name>.json``.
EVENT_NAMES = (
    "workflow_started",
    "node_started",
    "text_chunk",
    "node_finished",
    "human_input_required",
    "workflow_paused",
    "human_input_form_filled",
    "human_input_form_timeout",
    "workflow_finished",
)


def _is_integer(_checker: Any, instance: Any) -> bool:
    # jsonschema counts 3.0 as an integer (and Python counts True as one); a client in a typed
    # language would choke on either where the reference says int, so neither passes here.
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def schema_names() -> list[str]:
    """Every schema of the directory by name (the file name without ``.json``), ``common`` included."""
    return sorted(path.stem for path in SCHEMA_DIR.glob("*.json"))


def load_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
    return schema


@functools.cache
def registry() -> Registry[Any]:
    """Every schema of the directory under its ``$id``, so that relative ``$ref``\\s resolve offline."""
    resources = []
    for name in schema_names():
        schema = load_schema(name)
        if schema.get("$id") != f"{BASE_URI}{name}.json":
            raise AssertionError(f"schema {name}.json must have $id {BASE_URI}{name}.json, not {schema.get('$id')!r}")
        resources.append((schema["$id"], Resource.from_contents(schema, default_specification=DRAFT202012)))
    registry: Registry[Any] = Registry().with_resources(resources)
    return registry.crawl()


@functools.cache
def validator(name: str) -> Validator:
    schema = load_schema(name)
    _StrictValidator.check_schema(schema)
    validator: Validator = _StrictValidator(schema, registry=registry())
    return validator


def _path(error: ValidationError) -> str:
    return "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)


def _leaves(error: ValidationError) -> list[ValidationError]:
    # An allOf/anyOf/if-then failure wraps the errors that explain it; report those, at their own paths.
    if not error.context:
        return [error]
    return [leaf for child in error.context for leaf in _leaves(child)]


def validate(name: str, instance: Any, what: str = "") -> None:
    """Unless ``instance`` conforms to schema ``name``, raise an ``AssertionError`` naming the schema and the
    path of every failing field (``$.data.total_tokens``); ``what`` says what the instance is."""
    errors = sorted(validator(name).iter_errors(instance), key=lambda error: list(map(str, error.absolute_path)))
    if not errors:
        return
    lines = []
    for error in errors:
        for leaf in _leaves(error):
            line = f"  {_path(leaf)}: {leaf.message}"
            if line not in lines:
                lines.append(line)
    subject = f"{what} " if what else ""
    shown = json.dumps(instance, default=str)
    if len(shown) > 1500:
        shown = shown[:1500] + "…"
    raise AssertionError(f"{subject}does not conform to {name}.json:\n" + "\n".join(lines) + f"\ninstance: {shown}")


def validate_event(event: Any, what: str = "") -> None:
    """Validate a streamed event (``{"event", "task_id", "workflow_run_id", "data"}``) by its own event's schema."""
    name = event.get("event") if isinstance(event, dict) else None
    if name not in EVENT_NAMES:
        raise AssertionError(f"{what or 'event'} {name!r} is not a documented workflow event: {event!r}"[:2000])
    validate(f"event_{name}", event, what or f"{name} event")
