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
    WORKER_HEARTBEAT_INTERVAL: float = Field(
        default=10,
        ge=0,
        description="Seconds between a Celery worker's pings of its own consumer through the broker (a remote-"
        "control ping, answered by the loop that consumes the tasks even while every thread is busy); each answer "
        "is its heartbeat: the file VAR_DIR/worker-heartbeat-<node> (the worker's healthcheck) and a row the API's "
        "readiness reads. 0: no heartbeat.",
    )
    WORKER_CONSUME_BOUND: float = Field(
        default=60,
        ge=0,
        description="/health/ready answers 503 (workers: unavailable) when a task message a broker accepted has "
        "waited this long for a worker and no worker's heartbeat is this recent. 0: never.",
    )
    HEALTH_CHECK_TIMEOUT: float = Field(
        default=2.0,
        gt=0,
        description="Seconds /health/ready waits for its checks, all asked at once: it answers within this long "
        "however many dependencies hang (a check still running from an earlier probe is not asked again).",
    )
    ACCESS_LOG: str = Field(
        default="-",
        description="Where gunicorn writes the API's access log (api/gunicorn_conf.py): - (stdout), a file, or off. "
        "With LOG_FORMAT=json each line's fields (method, path, status, bytes, duration_ms, query) are JSON fields; "
        "query values and form tokens are redacted, headers never written.",
    )
