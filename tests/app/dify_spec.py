"""Dify's published Service API specification (``../shared/dify/openapi_service.json``) as a validator.

The spec is OpenAPI 3.0: its schemas become JSON Schema (draft 2020-12) here, ``nullable`` turned into a
``null`` alternative, ``$ref``\\s resolved inside the document. Nothing is fetched and nothing of the spec
is edited: a field the spec declares with a type must have it (or be ``null`` where it is nullable).

The spec's own artefacts, which no server can satisfy and which ``docs/dify-compatibility.md`` lists
with the reason, are the only exceptions: ``SPEC_ARTEFACTS``.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from harness.processes import ROOT

__all__ = ["SPEC_ARTEFACTS", "SPEC_PATH", "event_schema", "response_schema", "spec", "spec_errors", "validate_spec"]

#: Beside the repository, as laid out for every engineer and CI (``shared/dify``).
SPEC_PATH = ROOT.parent / "shared" / "dify" / "openapi_service.json"
_URI = "https://dify-spec.invalid/openapi_service.json"

#: Where the spec contradicts itself (each one in docs/dify-compatibility.md, "The spec's artefacts"):
#: ``user_input_form`` items are a ``oneOf`` of three object schemas that require nothing, so every item
#: matches all three and no item can match exactly one.
SPEC_ARTEFACTS = frozenset({"AppParametersResponse.user_input_form.oneOf"})


@functools.cache
def spec() -> dict[str, Any]:
    if not SPEC_PATH.is_file():
        raise AssertionError(f"Dify's published spec is not at {SPEC_PATH} (../shared/dify/openapi_service.json)")
    loaded: dict[str, Any] = json.loads(SPEC_PATH.read_text())
    return loaded


def _convert(node: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema: ``nullable`` becomes a ``null`` alternative."""
    if isinstance(node, list):
        return [_convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _convert(value) for key, value in node.items() if key not in ("example", "examples")}
    converted.pop("discriminator", None)
    if converted.pop("nullable", False):
        if isinstance(converted.get("type"), str) and "$ref" not in converted and "allOf" not in converted:
            converted["type"] = [converted["type"], "null"]
            if "enum" in converted:
                converted["enum"] = [*converted["enum"], None]
        else:
            return {"anyOf": [converted, {"type": "null"}]}
    return converted


def _without_artefacts(schemas: dict[str, Any]) -> dict[str, Any]:
    patched = copy.deepcopy(schemas)
    items = patched["AppParametersResponse"]["properties"]["user_input_form"]["items"]
    items["anyOf"] = items.pop("oneOf")  # see SPEC_ARTEFACTS
    return patched


@functools.cache
def _registry() -> Registry[Any]:
    document = {"components": {"schemas": _convert(_without_artefacts(spec()["components"]["schemas"]))}}
    return Registry().with_resource(_URI, Resource.from_contents(document, default_specification=DRAFT202012))


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    rooted = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": _URI + "#inline", **schema}
    return Draft202012Validator(_rebase(rooted), registry=_registry())


def _rebase(node: Any) -> Any:
    if isinstance(node, list):
        return [_rebase(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: (_URI + value if key == "$ref" and isinstance(value, str) and value.startswith("#") else _rebase(value))
        for key, value in node.items()
    }


def response_schema(method: str, path: str, status: int = 200, content: str = "application/json") -> dict[str, Any]:
    """The schema the spec gives the answer of ``method path`` with ``status``."""
    responses = spec()["paths"][path][method.lower()]["responses"]
    answer = responses[str(status)]
    if "$ref" in answer:
        answer = spec()["components"]["responses"][answer["$ref"].rsplit("/", 1)[1]]
    schema: dict[str, Any] = _convert(answer["content"][content]["schema"])
    return schema


def event_schema(event: str) -> dict[str, Any]:
    """The schema of a workflow stream event (``ChunkWorkflowEvent``'s mapping for ``event``)."""
    mapping = spec()["components"]["schemas"]["ChunkWorkflowEvent"]["discriminator"]["mapping"]
    return {"$ref": mapping[event]}


def spec_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """Every way ``instance`` breaks ``schema`` (``$.path: message``), none if it conforms."""
    errors = []
    for error in _validator(schema).iter_errors(instance):
        path = "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
        errors.append(f"{path}: {error.message}")
    return sorted(errors)


def validate_spec(schema: dict[str, Any], instance: Any, what: str) -> None:
    errors = spec_errors(schema, instance)
    assert not errors, f"{what} breaks Dify's published spec:\n  " + "\n  ".join(errors) + f"\n{instance!r}"[:3000]
