"""Celery tasks. Importing this package registers them with the app's Celery instance."""

from __future__ import annotations

from . import workflow_execution_tasks

__all__ = ["workflow_execution_tasks"]
