"""Database models."""

from __future__ import annotations

from .model import App
from .workflow import WorkflowRun, WorkflowRunStatus

__all__ = ["App", "WorkflowRun", "WorkflowRunStatus"]
