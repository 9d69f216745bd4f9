"""Workflow graphs: parsing and validation.

A graph is ``{"nodes": [...], "edges": [...]}``. Every node has an ``id`` and a ``type``; edges are
``{"source", "target"}`` plus ``"source_handle": "true" | "false"`` for ``if_else`` branches. A run
follows one path from the single ``start`` node to an ``end`` node, so the graph must be acyclic,
every node but ``end`` needs a successor (two for ``if_else``), and no node may have two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import WorkflowDefinitionError
from .form_fields import parse_actions, parse_fields

NODE_TYPES = frozenset({"start", "llm", "template", "if_else", "human_input", "end"})


@dataclasses.dataclass(frozen=True)
class Node:
    id: str
    type: str
    title: str
    config: Mapping[str, Any]


class Graph:
    def __init__(self, definition: Mapping[str, Any]) -> None:
        if not isinstance(definition, Mapping):
            raise WorkflowDefinitionError("a graph must be an object with 'nodes' and 'edges'")
        raw_nodes = definition.get("nodes")
        raw_edges = definition.get("edges", [])
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise WorkflowDefinitionError("a graph needs a non-empty 'nodes' list")
        if not isinstance(raw_edges, list):
            raise WorkflowDefinitionError("'edges' must be a list")
        self.nodes: dict[str, Node] = {}
        for raw in raw_nodes:
            node = _parse_node(raw)
            if node.id in self.nodes:
                raise WorkflowDefinitionError(f"duplicate node id {node.id!r}")
            self.nodes[node.id] = node
        self._next: dict[tuple[str, str | None], str] = {}
        for raw in raw_edges:
            self._add_edge(raw)
        starts = [node for node in self.nodes.values() if node.type == "start"]
        if len(starts) != 1:
            raise WorkflowDefinitionError("a graph needs exactly one 'start' node")
        self.start = starts[0]
        self._check_successors()
        self._check_acyclic()

    def successor(self, node_id: str, handle: str | None = None) -> Node | None:
        target = self._next.get((node_id, handle))
        return None if target is None else self.nodes[target]

    def _add_edge(self, raw: Any) -> None:
        if not isinstance(raw, Mapping):
            raise WorkflowDefinitionError("every edge must be an object")
        source, target = raw.get("source"), raw.get("target")
        if source not in self.nodes or target not in self.nodes:
            raise WorkflowDefinitionError(f"edge {source!r} -> {target!r} names an unknown node")
        handle = raw.get("source_handle")
        if self.nodes[source].type == "if_else":
            if handle not in ("true", "false"):
                raise WorkflowDefinitionError(
                    f"edges from if_else node {source!r} need source_handle 'true' or 'false'"
                )
        elif handle is not None:
            raise WorkflowDefinitionError(f"only if_else nodes have source handles (edge from {source!r})")
        if (source, handle) in self._next:
            raise WorkflowDefinitionError(f"node {source!r} has two successors for the same branch")
        self._next[(source, handle)] = target

    def _check_successors(self) -> None:
        for node in self.nodes.values():
            handles: tuple[str | None, ...] = ("true", "false") if node.type == "if_else" else (None,)
            for handle in handles:
                has_next = (node.id, handle) in self._next
                if node.type == "end" and has_next:
                    raise WorkflowDefinitionError(f"end node {node.id!r} cannot have a successor")
                if node.type != "end" and not has_next:
                    branch = f" ({handle} branch)" if handle else ""
                    raise WorkflowDefinitionError(f"node {node.id!r}{branch} has no successor")

    def _check_acyclic(self) -> None:
        state: dict[str, int] = {}

        def visit(node_id: str) -> None:
            state[node_id] = 1
            for (source, _), target in self._next.items():
                if source != node_id:
                    continue
                if state.get(target) == 1:
                    raise WorkflowDefinitionError(f"the graph has a cycle through {target!r}")
                if target not in state:
                    visit(target)
            state[node_id] = 2

        visit(self.start.id)


def _parse_node(raw: Any) -> Node:
    if not isinstance(raw, Mapping):
        raise WorkflowDefinitionError("every node must be an object")
    node_id, node_type = raw.get("id"), raw.get("type")
    if not isinstance(node_id, str) or not node_id or "." in node_id:
        raise WorkflowDefinitionError(f"invalid node id {node_id!r} (a non-empty string without '.')")
    if node_type not in NODE_TYPES:
        raise WorkflowDefinitionError(f"node {node_id!r} has unknown type {node_type!r}")
    title = raw.get("title") or node_id
    config = {key: value for key, value in raw.items() if key not in ("id", "type", "title")}
    _validate_config(node_id, node_type, config)
    return Node(node_id, node_type, str(title), config)


def _validate_config(node_id: str, node_type: str, config: Mapping[str, Any]) -> None:
    def need(key: str, kind: type | tuple[type, ...]) -> None:
        if not isinstance(config.get(key), kind):
            raise WorkflowDefinitionError(f"node {node_id!r} ({node_type}) needs '{key}'")

    if node_type == "start":
        variables = config.get("variables", [])
        if not isinstance(variables, list) or not all(isinstance(v, Mapping) and v.get("name") for v in variables):
            raise WorkflowDefinitionError(f"start node {node_id!r}: 'variables' must be a list of {{'name': ...}}")
    elif node_type == "llm":
        need("prompt", str)
    elif node_type == "template":
        need("template", str)
    elif node_type == "if_else":
        need("conditions", list)
    elif node_type == "human_input":
        parse_fields(node_id, config.get("form", []))
        parse_actions(node_id, config.get("actions"))
    elif node_type == "end":
        need("outputs", Mapping)
