"""Celery workers' heartbeats: each live worker's proof that its consumer answers the broker."""

from __future__ import annotations

from sqlalchemy import Float, String
from sqlalchemy.orm import Mapped, mapped_column

from .engine import db


class WorkerHeartbeat(db.Model):  # type: ignore[name-defined,misc]
    """A worker's last answered ping (``api.tasks.heartbeat``): /health/ready asks whether any is recent."""

    __tablename__ = "worker_heartbeats"

    #: The worker's Celery node name (``celery@host``).
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: Unix time the worker's consumer last answered a ping sent through the broker.
    beat_at: Mapped[float] = mapped_column(Float, index=True)
