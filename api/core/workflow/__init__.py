"""The app's adapter to graphon, Dify's graph engine: the only package that imports it.

Dify DSL apps are loaded and checked (``dsl``), their nodes built with our collaborators
(``node_factory``: the model runtime, the human-input callback), run by graphon, and graphon's events
mapped to Dify's stream responses (``event_mapping``) by the engine of one attempt (``engine``).
"""

from __future__ import annotations

from .dsl import AppDefinition, load_app, parse
from .engine import EngineOutcome, ResumePoint, WorkflowEngine, graphon_version
from .errors import WorkflowDefinitionError
from .graph import Graph
from .model_runtime import ModelSettings

__all__ = [
    "AppDefinition",
    "EngineOutcome",
    "Graph",
    "ModelSettings",
    "ResumePoint",
    "WorkflowDefinitionError",
    "WorkflowEngine",
    "graphon_version",
    "load_app",
    "parse",
]
