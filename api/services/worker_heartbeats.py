"""Workers' heartbeats in the app database (``worker_heartbeats``), which every API process can read."""

from __future__ import annotations

import time

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from api.models import WorkerHeartbeat
from api.models.engine import db


def record(name: str, at: float | None = None) -> None:
    """Worker ``name``'s consumer answered a ping at ``at`` (now)."""
    at = time.time() if at is None else at
    with db.engine.begin() as connection:
        changed = connection.execute(update(WorkerHeartbeat).where(WorkerHeartbeat.name == name).values(beat_at=at))
        if changed.rowcount:
            return
    try:
        with db.engine.begin() as connection:
            connection.execute(insert(WorkerHeartbeat).values(name=name, beat_at=at))
    except IntegrityError:  # its first two beats raced: either one will do
        pass


def latest() -> float | None:
    """When any worker's consumer last answered (``None``: never)."""
    with db.engine.begin() as connection:
        value = connection.execute(select(func.max(WorkerHeartbeat.beat_at))).scalar()
    return None if value is None else float(value)


def forget_older_than(cutoff: float) -> int:
    """Drop the beats of workers gone since ``cutoff`` (a replaced container's node name)."""
    with db.engine.begin() as connection:
        return int(connection.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.beat_at < cutoff)).rowcount)
