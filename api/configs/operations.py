"""Crash safety of user actions, supervision and readiness (``docs/operations.md``, its sections of the
same names)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

__all__ = ["OperationsSettings"]


class OperationsSettings(BaseSettings):
    WORKFLOW_REDISPATCH_AFTER: float = Field(
        default=30,
        gt=0,
        description="Seconds after a task message was handed to the broker within which a worker should claim its "
        "attempt; then the dispatcher sends it again (twice, four, eight times as long after each send), so a "
        "message the broker lost or a dead worker held still runs. Duplicates are harmless: one claim wins.",
    )
