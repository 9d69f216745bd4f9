"""The ``dwe`` command line (``python -m durable_workflow_client.cli`` works too)."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
