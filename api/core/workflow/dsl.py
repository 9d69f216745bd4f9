"""Dify app DSL files (``kind: app``, ``mode: workflow``): read, checked, refused with one line.

An app is checked as graphon would load it (every node's data validated, the graph's edges and root),
with our node factory: a node type this app cannot run (code without a sandbox, tool, document
extractor, …) or an HTTP request to a host not allowed is refused here, at ``create-app``, with one
line that names the node, never at the first run.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import yaml
from graphon.graph.graph import Graph as GraphonGraph
from graphon.nodes.human_input.entities import HITLContext, HITLDecision, PauseRequested
from graphon.runtime.init_params import InitParams
from graphon.runtime.runtime_state import RuntimeState
from graphon.runtime.variable_pool import VariablePool

from . import legacy
from .errors import WorkflowDefinitionError
from .graph import Graph
from .model_runtime import ModelSettings, StopSignal
from .node_factory import REFUSED, SUPPORTED, Collaborators, NodeFactory


@dataclasses.dataclass(frozen=True)
class AppDefinition:
    name: str
    mode: str
    #: ``workflow.graph`` of the DSL: what the app stores and every run loads.
    graph: dict[str, Any]


def parse(text: str) -> Mapping[str, Any]:
    """A DSL file's text (YAML; JSON is YAML too).

    Raises:
        WorkflowDefinitionError: not YAML, or not a mapping.
    """
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise WorkflowDefinitionError(f"not a YAML file: {str(error).splitlines()[0]}") from None
    if not isinstance(loaded, Mapping):
        raise WorkflowDefinitionError("a Dify DSL file is a mapping with 'kind: app'")
    return loaded


def load_app(document: Mapping[str, Any], *, allowed_hosts: frozenset[str] = frozenset()) -> AppDefinition:
    """The app a Dify DSL document defines (or an old JSON definition, converted once).

    Raises:
        WorkflowDefinitionError: with one line saying what is wrong or what this app cannot run.
    """
    if legacy.is_legacy(document):
        document = legacy.convert(document)
    if document.get("kind") != "app":
        raise WorkflowDefinitionError("not a Dify app DSL: 'kind' must be 'app'")
    app, workflow = document.get("app"), document.get("workflow")
    if not isinstance(app, Mapping):
        raise WorkflowDefinitionError("a Dify app DSL needs an 'app' mapping")
    name, mode = app.get("name"), app.get("mode")
    if not isinstance(name, str) or not name.strip():
        raise WorkflowDefinitionError("an app needs a 'name'")
    if mode != "workflow":
        raise WorkflowDefinitionError(f"only 'workflow' apps are supported, not {mode!r}")
    if not isinstance(workflow, Mapping) or not isinstance(workflow.get("graph"), Mapping):
        raise WorkflowDefinitionError("a workflow app's DSL needs 'workflow.graph'")
    graph = dict(workflow["graph"])
    check_graph(graph, allowed_hosts=allowed_hosts)
    return AppDefinition(name.strip(), mode, graph)


def check_graph(graph: Mapping[str, Any], *, allowed_hosts: frozenset[str] = frozenset()) -> None:
    """Refuse what this app cannot run, then build the graph as a run would (without running it).

    Raises:
        WorkflowDefinitionError: one line naming the node.
    """
    view = Graph(graph)
    for node in view.nodes.values():
        if node.type in REFUSED or node.type not in SUPPORTED:
            reason = REFUSED.get(node.type, "this app does not know that node type")
            raise WorkflowDefinitionError(f"node {node.id!r} ({node.type}): {reason}")
        if node.type == "http-request":
            _check_url(node.id, str(node.config.get("url") or ""), allowed_hosts)
    try:
        build_graph(
            graph, root=view.start.id, workflow_id="check", runtime_state=_blank_state(), collaborators=_CHECKING
        )
    except WorkflowDefinitionError:
        raise
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise WorkflowDefinitionError(f"graph: {first}") from None


def _check_url(node_id: str, url: str, allowed_hosts: frozenset[str]) -> None:
    host = urllib.parse.urlsplit(url).hostname or ""
    if "{{" in host or not host:
        raise WorkflowDefinitionError(f"node {node_id!r} (http-request): its URL's host must be written out")
    if host not in allowed_hosts:
        allowed = ", ".join(sorted(allowed_hosts)) or "none"
        raise WorkflowDefinitionError(
            f"node {node_id!r} (http-request): host {host!r} is not allowed (WORKFLOW_HTTP_ALLOWED_HOSTS: {allowed})"
        )


def build_graph(
    graph: Mapping[str, Any],
    *,
    root: str,
    workflow_id: str,
    runtime_state: RuntimeState,
    collaborators: Collaborators,
) -> GraphonGraph:
    """graphon's graph of ``graph`` with our node factory, bound to ``runtime_state``."""
    params = InitParams(workflow_id=workflow_id, graph_config=graph, run_context={}, call_depth=0)
    factory = NodeFactory(params, runtime_state, collaborators)
    return GraphonGraph.init(graph_config=graph, node_factory=factory, root_node_id=root)


def _blank_state() -> RuntimeState:
    return RuntimeState(variable_pool=VariablePool(), start_at=time.time(), workflow_id="check")


def _never_called(context: HITLContext) -> HITLDecision:
    return PauseRequested(session_id="")


_CHECKING = Collaborators(ModelSettings(), StopSignal(), _never_called)
