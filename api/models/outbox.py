"""The task outbox: every task message a user's action needs, recorded with the action itself.

A run's start and a form's answer (or its timeout) each queue a new execution attempt. Its message is
written here in the same transaction that accepts the action, so that no process dying afterwards can
lose it: the request sends it at once, and a dispatcher (every reaper sweep, and every read of the run)
sends it again when it was never sent, or when no worker claimed the attempt within a bound of its last
send (a broker that lost it, a worker that died holding it). A worker's claim of the attempt removes the
row in the claim's own transaction; a row whose attempt is no longer its run's current one is dropped.
"""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .engine import db


class TaskOutbox(db.Model):  # type: ignore[name-defined,misc]
    """One execution attempt's task message, until a worker claims the attempt."""

    __tablename__ = "workflow_task_outbox"

    #: The attempt the message names (one message per attempt).
    attempt_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(36), ForeignKey("workflow_runs.id"), index=True)
    #: ``workflow_based_app_execution_task`` (a start) or ``resume_app_execution`` (an answer, a timeout).
    task: Mapped[str] = mapped_column(String(64))
    #: What resumes the attempt (JSON), for a resume.
    resume_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    #: Unix time from which the dispatcher sends it (again): the accepting request's grace at first, then
    #: the bound after each send within which a worker should have claimed it.
    due_at: Mapped[float] = mapped_column(Float, index=True)
    #: How many times a broker accepted it.
    sends: Mapped[int] = mapped_column(Integer, default=0)
    #: Unix time a broker last accepted it (``None``: never yet).
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
