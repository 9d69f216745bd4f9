"""The app's view of a Dify workflow graph: each node's id, type, title and its settings.

graphon runs the graph; the rest of the app reads only a few things of it: the start node's variables
(inputs to check, Dify's ``user_input_form``) and each human-input node's form (fields, buttons, content,
timeout). This module reads them from Dify's node data once, in the shapes the app uses: a start
variable is ``{"name", "type", "required", "default", "label", …}``, a form is ``form_fields``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .errors import WorkflowDefinitionError
from .form_fields import parse_actions, parse_fields

#: Dify's ``timeout_unit`` of a human-input node, in seconds.
_TIMEOUT_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
HUMAN_INPUT = "human-input"


@dataclasses.dataclass(frozen=True)
class Node:
    id: str
    type: str
    title: str
    config: Mapping[str, Any]


class Graph:
    """A Dify graph (``workflow.graph`` of an app's DSL: ``{"nodes": [{"id", "data"}], "edges": [...]}``)."""

    def __init__(self, definition: Mapping[str, Any]) -> None:
        if not isinstance(definition, Mapping):
            raise WorkflowDefinitionError("a graph must be an object with 'nodes' and 'edges'")
        raw_nodes = definition.get("nodes")
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise WorkflowDefinitionError("a graph needs a non-empty 'nodes' list")
        self.nodes: dict[str, Node] = {}
        for raw in raw_nodes:
            node = _parse_node(raw)
            if node.id in self.nodes:
                raise WorkflowDefinitionError(f"duplicate node id {node.id!r}")
            self.nodes[node.id] = node
        # Nodes inside an iteration or a loop have a parent: the run's own start is the top-level one.
        starts = [
            node
            for node in self.nodes.values()
            if node.type == "start" and not (isinstance(raw_nodes, list) and _parent_of(raw_nodes, node.id))
        ]
        if len(starts) != 1:
            raise WorkflowDefinitionError("a graph needs exactly one 'start' node")
        self.start = starts[0]
        self.edges: list[Mapping[str, Any]] = [
            edge for edge in definition.get("edges") or [] if isinstance(edge, Mapping)
        ]

    def predecessors(self) -> dict[str, str]:
        """Each node with exactly one edge into it, and that edge's source."""
        sources: dict[str, list[str]] = {}
        for edge in self.edges:
            sources.setdefault(str(edge.get("target")), []).append(str(edge.get("source")))
        return {target: found[0] for target, found in sources.items() if len(found) == 1}

    def handles_from(self, node_id: str) -> set[str]:
        """The source handles of the edges leaving ``node_id``."""
        return {str(edge.get("sourceHandle") or "source") for edge in self.edges if edge.get("source") == node_id}


def _parent_of(raw_nodes: list[Any], node_id: str) -> str | None:
    for raw in raw_nodes:
        if isinstance(raw, Mapping) and raw.get("id") == node_id:
            parent = (
                raw.get("parentId")
                or (raw.get("data") or {}).get("iteration_id")
                or (raw.get("data") or {}).get("loop_id")
            )
            return str(parent) if parent else None
    return None


def _parse_node(raw: Any) -> Node:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("data"), Mapping):
        raise WorkflowDefinitionError("every node must be an object with an 'id' and its 'data'")
    node_id, data = raw.get("id"), raw["data"]
    node_type = data.get("type")
    if not isinstance(node_id, str) or not node_id:
        raise WorkflowDefinitionError(f"invalid node id {node_id!r}")
    if not isinstance(node_type, str) or not node_type:
        raise WorkflowDefinitionError(f"node {node_id!r} has no type")
    title = str(data.get("title") or node_id)
    config: Mapping[str, Any] = dict(data)
    if node_type == "start":
        config = {"variables": [_start_variable(node_id, variable) for variable in data.get("variables") or []]}
    elif node_type == HUMAN_INPUT:
        config = _form(node_id, data)
    return Node(node_id, node_type, title, config)


def _start_variable(node_id: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("variable"), str) or not raw["variable"]:
        raise WorkflowDefinitionError(f"start node {node_id!r}: every variable needs a 'variable' name")
    variable = {key: value for key, value in raw.items() if key != "variable"}
    variable["name"] = raw["variable"]
    if variable.get("default") in (None, ""):
        variable.pop("default", None)
    return variable


def _form(node_id: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """A human-input node's Dify data (``inputs``, ``user_actions``, ``timeout`` + unit) as a form."""
    fields = []
    for raw in data.get("inputs") or []:
        if not isinstance(raw, Mapping):
            raise WorkflowDefinitionError(f"human-input node {node_id!r}: every input must be an object")
        field = {key: value for key, value in raw.items() if key != "output_variable_name"}
        field["name"] = raw.get("output_variable_name")
        if "option_source" in raw:
            field["option_source"] = _source(raw["option_source"])
        if "default" in raw and raw["default"] is not None:
            field["default"] = _source(raw["default"])
        fields.append(field)
    form: dict[str, Any] = {"form": fields}
    if data.get("user_actions"):
        form["actions"] = list(data["user_actions"])
    if isinstance(data.get("form_content"), str) and data["form_content"]:
        form["form_content"] = data["form_content"]
    if data.get("timeout"):
        form["timeout"] = _timeout(node_id, data["timeout"], str(data.get("timeout_unit") or "second"))
    parse_fields(node_id, form["form"])
    parse_actions(node_id, form.get("actions"))
    return form


def _timeout(node_id: str, raw: Any, unit: str) -> float:
    """A form's timeout in seconds: a finite, positive number (or numeric string) of ``unit``."""
    seconds = math.nan
    if not isinstance(raw, bool):  # YAML's ``yes`` is no timeout
        with contextlib.suppress(TypeError, ValueError):
            seconds = float(raw) * _TIMEOUT_UNITS.get(unit, 1)
    if not math.isfinite(seconds) or seconds <= 0:
        raise WorkflowDefinitionError(f"human-input node {node_id!r}: timeout must be a positive number, not {raw!r}")
    return seconds


def _source(raw: Any) -> Any:
    """Dify's ``{"type": "variable", "selector"}`` / ``{"type": "constant", "value"}`` sources, as forms read them."""
    if isinstance(raw, Mapping) and raw.get("type") == "variable":
        return {"type": "variable", "selector": list(raw.get("selector") or [])}
    return raw
