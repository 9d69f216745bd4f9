"""Database models."""

from __future__ import annotations

from .end_user import EndUser, UploadFile
from .human_input import HumanInputForm, HumanInputFormStatus, IdempotencyKey
from .model import App
from .outbox import TaskOutbox
from .row_copy import RowCopy
from .workflow import WorkflowRun, WorkflowRunStatus

__all__ = [
    "App",
    "EndUser",
    "HumanInputForm",
    "HumanInputFormStatus",
    "IdempotencyKey",
    "RowCopy",
    "TaskOutbox",
    "UploadFile",
    "WorkflowRun",
    "WorkflowRunStatus",
]
