"""A small, real workflow graph engine: start, llm (simulated), template, if_else, human_input, end."""

from __future__ import annotations

from .engine import EngineOutcome, WorkflowEngine
from .errors import WorkflowDefinitionError
from .graph import Graph

__all__ = ["EngineOutcome", "Graph", "WorkflowDefinitionError", "WorkflowEngine"]
