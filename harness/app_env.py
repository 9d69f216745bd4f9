"""The environment of a test or benchmark app: embedded SQLite for data and streams, a Redis broker.

Every setting the app reads comes from :class:`api.configs.AppConfig`; this is the small, fast
profile the tests and the soak share (short leases and stop checks, near-instant fake LLM tokens, a
queue of its own so parallel runs never pick each other's tasks).
"""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

from harness.services import redis_url

__all__ = ["BROKER_URL", "base_env"]

BROKER_URL = redis_url(0)


def base_env(var_dir: pathlib.Path, **overrides: Any) -> dict[str, str]:
    """Settings for an app whose files live in ``var_dir``; ``overrides`` win (values are ``str()``-ed)."""
    env = {
        "VAR_DIR": str(var_dir),
        "SQLALCHEMY_DATABASE_URI": f"sqlite:///{var_dir / 'app.db'}",
        "DURABLE_STREAM_URL": f"sqlite:///{var_dir / 'streams.db'}",
        "CELERY_BROKER_URL": BROKER_URL,
        "CELERY_QUEUE": f"test-{uuid.uuid4().hex[:12]}",
        "WORKFLOW_LLM_TOKEN_DELAY": "0.001",
        "WORKFLOW_LEASE_TTL": "3",
        "WORKFLOW_STOP_CHECK_INTERVAL": "0.05",
        "APP_MAX_EXECUTION_TIME": "120",
        # Long enough for DEPLOY_ENV=PRODUCTION (the default), which the tests run in.
        "SECRET_KEY": "test-secret-of-at-least-32-bytes-for-production",
        # Every test client is 127.0.0.1, and with REDIS_URL the shared Redis counts for all of them:
        # tests/app/test_limits.py sets the passport limit it checks.
        "LIMIT_PASSPORTS_PER_MINUTE": "0",
        # Many tests open dozens of streams as one end user of one app; those that check the open-stream
        # limits (tests/app/test_limits.py, test_herd.py) set them.
        "LIMIT_SSE_STREAMS_PER_END_USER": "0",
        "LIMIT_SSE_STREAMS_PER_KEY": "0",
        # Likewise a hostile-input run starts runs as fast as it can (tests/app/test_limits.py sets it).
        "LIMIT_RUN_STARTS_PER_SECOND": "0",
    }
    env.update({key: str(value) for key, value in overrides.items()})
    return env
