from __future__ import annotations

import datetime
import enum
import json
from typing import Any

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, true
from sqlalchemy.orm import Mapped, mapped_column

from .engine import db
from .model import new_id, utc_now


class WorkflowRunStatus(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_terminal(self) -> bool:
        return self in (WorkflowRunStatus.SUCCEEDED, WorkflowRunStatus.FAILED, WorkflowRunStatus.STOPPED)


class WorkflowRun(db.Model):  # type: ignore[name-defined,misc]
    """One run of an app's workflow, across pauses and resumes (one task id, one event topic)."""

    __tablename__ = "workflow_runs"
    #: An app's active runs are counted at each start when APP_MAX_ACTIVE_REQUESTS is set.
    __table_args__ = (Index("ix_workflow_runs_app_status", "app_id", "status"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    task_id: Mapped[str] = mapped_column(String(36), unique=True, index=True, default=new_id)
    app_id: Mapped[str] = mapped_column(String(36), ForeignKey("apps.id"), index=True)
    end_user: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default=WorkflowRunStatus.RUNNING.value)
    inputs_json: Mapped[str] = mapped_column(Text, default="{}")
    outputs_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: Engine state saved at a pause (variable pool, paused node); cleared when the run ends.
    state_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: What resumes the current attempt (a form's answer or its timeout), kept so that an attempt whose
    #: task message was lost can be queued again with it.
    resume_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    total_steps: Mapped[int] = mapped_column(Integer, default=0)
    #: The simulated model's tokens over the run (recorded at each pause and at the end).
    total_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Unix time until which the executing worker holds the run; renewed while it executes.
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The execution attempt queued last (a new one per dispatch): a redelivered or stale task
    #: message names an attempt, and only the first delivery of the current one may start it.
    attempt_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    #: Unix time the current attempt was queued; a run not started within the start deadline ends.
    dispatched_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Unix time the current attempt's task message was handed to the broker (``None`` until then): a
    #: committed run whose message never left its API process is queued again after a short grace.
    queued_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Unix time a worker claimed the current attempt (``None`` while it waits in the queue).
    attempt_started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The incarnation (epoch) of the run's topic when the run started: a reader that finds
    #: another one knows the retained events are not this run's whole history.
    stream_epoch: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: Whether the run's topic ends with its ``workflow_finished`` and is sealed. A terminal run
    #: without it is "end pending": a repair appends the end once the stream store is back.
    stream_ended: Mapped[bool] = mapped_column(
        Boolean,
        default=False,
        # Rows that predate the column were ended by the code of their time: never repair them.
        server_default=true(),
    )
    #: Unix time before which nobody else may repair the end (its finisher is still retrying it).
    stream_repair_after: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The topic's last ordinal and last digest when its end was written (sealed): the position that
    #: proves a stream whole later, and whose absence (a store failover lost the end) gets it repaired.
    stream_final_ordinal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stream_final_digest: Mapped[str | None] = mapped_column(String(16), nullable=True)
    #: The last event the worker appended, as its lease renewal last recorded it (ordinal, digest): if
    #: the worker dies and the store has lost it, the run's history is beyond repair, and says so.
    stream_progress_ordinal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stream_progress_digest: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    finished_at: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    @property
    def inputs(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.inputs_json or "{}")
        return value

    @property
    def outputs(self) -> dict[str, Any] | None:
        return None if self.outputs_json is None else json.loads(self.outputs_json)

    def state_after_pause(self) -> dict[str, Any]:
        if self.state_json is None:
            raise ValueError(f"run {self.id} has no saved pause state")
        value: dict[str, Any] = json.loads(self.state_json)
        return value

    @property
    def run_status(self) -> WorkflowRunStatus:
        return WorkflowRunStatus(self.status)

    @property
    def created_timestamp(self) -> float:
        return _aware(self.created_at).timestamp()

    @property
    def finished_timestamp(self) -> float | None:
        return _aware(self.finished_at).timestamp() if self.finished_at else None

    @property
    def elapsed_time(self) -> float:
        created = _aware(self.created_at)
        end = _aware(self.finished_at) if self.finished_at else utc_now()
        return max(0.0, (end - created).total_seconds())


def _aware(value: datetime.datetime) -> datetime.datetime:
    # SQLite hands back naive datetimes even for timezone-aware columns.
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
