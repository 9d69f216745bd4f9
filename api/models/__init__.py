"""Database models."""

from __future__ import annotations

from .human_input import HumanInputForm, HumanInputFormStatus, IdempotencyKey
from .limits import LimitCounter, LimitEvent, LimitSlot
from .model import App, CredentialRevision
from .row_copy import RowCopy
from .workflow import WorkflowRun, WorkflowRunStatus

__all__ = [
    "App",
    "CredentialRevision",
    "HumanInputForm",
    "HumanInputFormStatus",
    "IdempotencyKey",
    "LimitCounter",
    "LimitEvent",
    "LimitSlot",
    "RowCopy",
    "WorkflowRun",
    "WorkflowRunStatus",
]
