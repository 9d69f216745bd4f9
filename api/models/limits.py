"""Where the per-tenant limits count when the app has no Redis (the embedded profile): three small tables.

Each change is a short transaction of its own that first takes one of :data:`LOCK_STRIPES` lock rows
(an ``UPDATE``: a row lock in PostgreSQL, the write lock in SQLite), so the count it reads is the
count it changes, whichever process asks (``api.services.limit_store``).
"""

from __future__ import annotations

from sqlalchemy import Float, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from .engine import db

__all__ = ["LOCK_STRIPES", "LimitCounter", "LimitEvent", "LimitSlot"]

#: Lock rows are ``lock:<n>`` for n below this: keys share them, so the table never grows with the keys.
LOCK_STRIPES = 64


class LimitCounter(db.Model):  # type: ignore[name-defined,misc]
    """An amount counted in a fixed window (bytes a key wrote this minute), or a lock row (``lock:<n>``)."""

    __tablename__ = "limit_counters"

    key: Mapped[str] = mapped_column(String(300), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)
    window_ends: Mapped[float] = mapped_column(Float, default=0.0)


class LimitEvent(db.Model):  # type: ignore[name-defined,misc]
    """One counted event (a run start, a passport, a gateway stream) in a sliding window."""

    __tablename__ = "limit_events"
    __table_args__ = (Index("ix_limit_events_key_at", "key", "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(300))
    at: Mapped[float] = mapped_column(Float)


class LimitSlot(db.Model):  # type: ignore[name-defined,misc]
    """One held slot of a concurrency limit (an open event stream), until released or its lease expires."""

    __tablename__ = "limit_slots"

    scope: Mapped[str] = mapped_column(String(300), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[float] = mapped_column(Float)
