from __future__ import annotations


class WorkflowDefinitionError(ValueError):
    """A workflow graph is invalid; raised when an app is created, never mid-run."""


class NodeRunError(Exception):
    """A node failed at run time; the run ends with ``workflow_finished(failed)``."""
