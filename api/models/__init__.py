"""Database models."""

from __future__ import annotations

from .end_user import EndUser, UploadFile
from .human_input import HumanInputForm, HumanInputFormStatus, IdempotencyKey
from .limits import LimitCounter, LimitEvent, LimitSlot
from .model import App, CredentialRevision
from .outbox import TaskOutbox
from .row_copy import RowCopy
from .worker import WorkerHeartbeat
from .workflow import WorkflowRun, WorkflowRunStatus

__all__ = [
    "App",
    "CredentialRevision",
    "EndUser",
    "HumanInputForm",
    "HumanInputFormStatus",
    "IdempotencyKey",
    "LimitCounter",
    "LimitEvent",
    "LimitSlot",
    "RowCopy",
    "TaskOutbox",
    "UploadFile",
    "WorkerHeartbeat",
    "WorkflowRun",
    "WorkflowRunStatus",
]
