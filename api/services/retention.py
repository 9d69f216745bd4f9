"""Retention of run events: one ``enforce_retention()`` sweep of the stream store, counted and logged.

The reaper thread of every worker calls it every ``DURABLE_STREAM_RETENTION_INTERVAL`` seconds and
Celery beat schedules it as the ``enforce_stream_retention`` task every ``BEAT_RETENTION_INTERVAL``
seconds; sweeps from several places at once are harmless (each removes what is expired by then).
"""

from __future__ import annotations

import logging

from flask import current_app

from api.configs import AppConfig
from api.extensions.ext_durable_stream import durable_stream
from api.libs import metrics

logger = logging.getLogger(__name__)


def enforce_retention() -> int:
    """Remove the records retention expired; return how many (0 on the live-only transport).

    Raises:
        DurableStreamError: The stream store failed (counted as a failed sweep).
    """
    config: AppConfig = current_app.config["APP_CONFIG"]
    if config.WORKFLOW_EVENT_TRANSPORT != "durable_stream":
        return 0
    try:
        removed = durable_stream().admin.enforce_retention()
    except Exception:
        metrics.RETENTION_SWEEPS.tally.add(("failed",))
        raise
    metrics.RETENTION_SWEEPS.tally.add(("ok",))
    if removed:
        metrics.RETENTION_REMOVED.tally.add((), removed)
        logger.info("retention removed %d record(s)", removed)
    return removed
