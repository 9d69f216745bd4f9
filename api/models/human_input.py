"""Human-input forms and idempotency keys: the rows behind Dify's form tokens and safe POST retries."""

from __future__ import annotations

import datetime
import enum
import json
from typing import Any

from sqlalchemy import DateTime, Float, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from .engine import db
from .model import new_id, utc_now


class HumanInputFormStatus(enum.StrEnum):
    WAITING = "waiting"
    SUBMITTED = "submitted"
    #: Its ``expires_at`` passed before anyone submitted it; the run resumed with a timeout.
    EXPIRED = "expired"
    #: Its run ended another way (stopped, failed) while it waited.
    CLOSED = "closed"


class HumanInputForm(db.Model):  # type: ignore[name-defined,misc]
    """One paused node's form, answerable by its token until it is submitted or expires."""

    __tablename__ = "human_input_forms"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    #: The secret a client submits the form by (``/form/human_input/<token>``).
    token: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    app_id: Mapped[str] = mapped_column(String(36), ForeignKey("apps.id"), index=True)
    run_id: Mapped[str] = mapped_column(String(36), ForeignKey("workflow_runs.id"), index=True)
    node_id: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(16), default=HumanInputFormStatus.WAITING.value, index=True)
    #: The form as ``human_input_required`` showed it.
    definition_json: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    action_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    answered_at: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    @property
    def definition(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.definition_json)
        return value


class IdempotencyKey(db.Model):  # type: ignore[name-defined,misc]
    """A client's ``Idempotency-Key`` for starting a run: the same key and body get the same run."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("app_id", "end_user", "key", name="uq_idempotency_keys_scope"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    app_id: Mapped[str] = mapped_column(String(36), ForeignKey("apps.id"))
    end_user: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(255))
    #: SHA-256 of the request body's canonical JSON: another body under the same key is refused.
    fingerprint: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str] = mapped_column(String(36), ForeignKey("workflow_runs.id"))
    created_at: Mapped[float] = mapped_column(Float, index=True)
