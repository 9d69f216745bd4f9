"""The app's JSON workflow format of earlier versions, converted once into a Dify DSL graph.

Earlier versions took ``{"name", "mode", "graph": {"nodes": [{"id", "type", ...}], "edges": [...]}}``
with six node types of their own and ``{{node.variable}}`` templates. ``create-app`` converts such a
file when the app is created and stores only the Dify graph; nothing runs the old format any more.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import WorkflowDefinitionError

_REFERENCE = re.compile(r"\{\{\s*([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)\s*\}\}")
_OPERATORS = {
    "equals": "is",
    "not_equals": "is not",
    "contains": "contains",
    "not_contains": "not contains",
    "empty": "empty",
    "not_empty": "not empty",
    "gt": ">",
    "lt": "<",
}
#: The simulated model's settings an old llm node could carry; they go to its ``completion_params``.
_MODEL_SETTINGS = ("token_delay", "error_after_tokens", "error")


def is_legacy(definition: Mapping[str, Any]) -> bool:
    """An old definition: a top-level ``graph`` whose nodes carry their ``type`` (Dify's carry ``data``)."""
    graph = definition.get("graph")
    if "kind" in definition or not isinstance(graph, Mapping):
        return False
    nodes = graph.get("nodes")
    return isinstance(nodes, list) and all(isinstance(node, Mapping) and "data" not in node for node in nodes)


def _dify_template(text: str) -> str:
    return _REFERENCE.sub(lambda match: f"{{{{#{match.group(1)}.{match.group(2)}#}}}}", text)


def _node(node_id: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"id": node_id, "type": "custom", "data": data}


def _edge(source: str, target: str, handle: str = "source") -> dict[str, Any]:
    return {"id": f"{source}-{handle}-{target}", "source": source, "target": target, "sourceHandle": handle}


def convert(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The Dify DSL (``kind: app``, ``mode: workflow``) of an old definition.

    Raises:
        WorkflowDefinitionError: a node or an edge the old format did not allow either.
    """
    graph = definition["graph"]
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for raw in graph.get("nodes") or []:
        node_id, node_type = str(raw.get("id")), raw.get("type")
        title = str(raw.get("title") or node_id)
        converter = _CONVERTERS.get(str(node_type))
        if converter is None:
            raise WorkflowDefinitionError(f"node {node_id!r} has unknown type {node_type!r}")
        converted, extra_edges = converter(node_id, title, raw)
        nodes.extend(converted)
        edges.extend(extra_edges)
    for raw in graph.get("edges") or []:
        if not isinstance(raw, Mapping):
            raise WorkflowDefinitionError("every edge must be an object")
        target = str(raw.get("target"))
        # An end node with a template output got a template node before it (see _end).
        if any(node["id"] == f"{target}__outputs" for node in nodes):
            target = f"{target}__outputs"
        edges.append(_edge(str(raw.get("source")), target, str(raw.get("source_handle") or "source")))
    return {
        "kind": "app",
        "version": "0.4.0",
        "app": {"name": definition.get("name"), "mode": definition.get("mode", "workflow"), "description": ""},
        "workflow": {
            "environment_variables": [],
            "conversation_variables": [],
            "graph": {"nodes": nodes, "edges": edges},
        },
    }


Converted = tuple[list[dict[str, Any]], list[dict[str, Any]]]


def _start(node_id: str, title: str, raw: Mapping[str, Any]) -> Converted:
    variables = []
    for variable in raw.get("variables") or []:
        if not isinstance(variable, Mapping) or not variable.get("name"):
            raise WorkflowDefinitionError(f"start node {node_id!r}: 'variables' must be a list of {{'name': ...}}")
        converted = {key: value for key, value in variable.items() if key != "name"}
        converted.update(
            variable=variable["name"],
            label=str(variable.get("label") or variable["name"]),
            type=variable.get("type") or "text-input",
            required=bool(variable.get("required", False)),
        )
        variables.append(converted)
    return [_node(node_id, {"type": "start", "title": title, "variables": variables})], []


def _llm(node_id: str, title: str, raw: Mapping[str, Any]) -> Converted:
    if not isinstance(raw.get("prompt"), str):
        raise WorkflowDefinitionError(f"node {node_id!r} (llm) needs 'prompt'")
    prompts = [{"role": "user", "text": _dify_template(raw["prompt"])}]
    if isinstance(raw.get("response"), str):  # the simulated model answers a trailing assistant message
        prompts.append({"role": "assistant", "text": _dify_template(raw["response"])})
    params = {key: raw[key] for key in _MODEL_SETTINGS if key in raw}
    data = {
        "type": "llm",
        "title": title,
        "model": {"provider": "simulated", "name": "simulated", "mode": "chat", "completion_params": params},
        "prompt_template": prompts,
        "context": {"enabled": False, "variable_selector": []},
        "vision": {"enabled": False},
    }
    return [_node(node_id, data)], []


def _template_data(title: str, text: str) -> dict[str, Any]:
    """A template-transform node rendering an old ``{{node.variable}}`` template with jinja2."""
    variables = []
    for node, name in dict.fromkeys(_REFERENCE.findall(text)):
        variables.append({"variable": f"{node}__{name}".replace("-", "_"), "value_selector": [node, name]})
    template = _REFERENCE.sub(lambda match: f"{{{{ {match.group(1)}__{match.group(2)} }}}}".replace("-", "_"), text)
    return {"type": "template-transform", "title": title, "variables": variables, "template": template}


def _template(node_id: str, title: str, raw: Mapping[str, Any]) -> Converted:
    if not isinstance(raw.get("template"), str):
        raise WorkflowDefinitionError(f"node {node_id!r} (template) needs 'template'")
    return [_node(node_id, _template_data(title, raw["template"]))], []


def _if_else(node_id: str, title: str, raw: Mapping[str, Any]) -> Converted:
    conditions = []
    for index, condition in enumerate(raw.get("conditions") or []):
        selector = str(condition.get("variable", "")).split(".", 1)
        operator = str(condition.get("operator", "equals"))
        if operator not in _OPERATORS:
            raise WorkflowDefinitionError(f"node {node_id!r}: unknown operator {operator!r}")
        value = condition.get("value")
        conditions.append(
            {
                "id": f"c{index}",
                "variable_selector": selector,
                "comparison_operator": _OPERATORS[operator],
                "value": "" if value is None else str(value),
            }
        )
    case = {"case_id": "true", "logical_operator": raw.get("logical_operator", "and"), "conditions": conditions}
    return [_node(node_id, {"type": "if-else", "title": title, "cases": [case]})], []


def _human_input(node_id: str, title: str, raw: Mapping[str, Any]) -> Converted:
    inputs = []
    for field in raw.get("form") or []:
        if not isinstance(field, Mapping):
            raise WorkflowDefinitionError(f"human_input node {node_id!r}: 'form' must be a list of objects")
        converted = {key: value for key, value in field.items() if key != "name"}
        converted["output_variable_name"] = field.get("name")
        inputs.append(converted)
    data: dict[str, Any] = {"type": "human-input", "title": title, "inputs": inputs}
    if raw.get("actions") is not None:
        data["user_actions"] = raw["actions"]
    if "form_content" in raw:
        data["form_content"] = raw["form_content"]
    if raw.get("timeout"):
        data.update(timeout=raw["timeout"], timeout_unit="second")
    return [_node(node_id, data)], []


def _end(node_id: str, title: str, raw: Mapping[str, Any]) -> Converted:
    outputs = raw.get("outputs")
    if not isinstance(outputs, Mapping):
        raise WorkflowDefinitionError(f"node {node_id!r} (end) needs 'outputs'")
    converted, templates = [], {}
    for name, spec in outputs.items():
        if isinstance(spec, Mapping) and "variable" in spec:
            converted.append({"variable": name, "value_selector": str(spec["variable"]).split(".", 1)})
        elif (match := _REFERENCE.fullmatch(str(spec).strip())) is not None:
            converted.append({"variable": name, "value_selector": [match.group(1), match.group(2)]})
        else:
            templates[name] = str(spec)
            converted.append({"variable": name, "value_selector": [f"{node_id}__outputs", "output"]})
    nodes = [_node(node_id, {"type": "end", "title": title, "outputs": converted})]
    edges: list[dict[str, Any]] = []
    if templates:
        # Old end outputs could be templates; Dify's read variables: one template node per output.
        (name, text), *more = templates.items()
        if more:
            raise WorkflowDefinitionError(f"end node {node_id!r}: at most one template output converts")
        data = _template_data(f"{title} ({name})", text)
        nodes.append(_node(f"{node_id}__outputs", data))
        edges.append(_edge(f"{node_id}__outputs", node_id))
    return nodes, edges


_CONVERTERS = {
    "start": _start,
    "llm": _llm,
    "template": _template,
    "if_else": _if_else,
    "human_input": _human_input,
    "end": _end,
}
