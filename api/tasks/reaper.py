"""The reaper: a thread in every Celery worker and every API worker process that ends runs whose owner
is gone (and, in the Celery workers, applies retention).

Each sweep (every ``WORKFLOW_REAPER_INTERVAL`` seconds, with jitter so that several workers spread
out) fails runs whose lease expired or whose queued attempt was never started, and writes the
pending ends of terminal runs (:func:`api.services.run_recovery.reap`); it also expires human-input
forms whose time is up (their runs resume with the timeout), forgets old idempotency keys and the
heartbeats of workers gone for a day, and sends the task outbox's due messages (``task_queue``). Every
``DURABLE_STREAM_RETENTION_INTERVAL`` seconds it also calls the stream store's
``enforce_retention()``. Sweeps from several workers at once are harmless: every change they make
is a conditional update that one of them wins.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from flask import Flask

from api.configs import AppConfig
from api.models.engine import db
from api.services import human_input_service, idempotency, worker_heartbeats
from api.services.retention import enforce_retention
from api.services.run_recovery import reap

logger = logging.getLogger(__name__)

#: Seconds a worker's last heartbeat is kept after it stopped beating (a replaced container's node name).
HEARTBEAT_MEMORY = 24 * 3600.0


class Reaper:
    """Sweeps every ``interval`` seconds (default: the worker's ``WORKFLOW_REAPER_INTERVAL``); applies
    retention too unless ``retention`` is false (an API process leaves that to the workers and beat)."""

    def __init__(self, app: Flask, *, interval: float | None = None, retention: bool = True) -> None:
        config: AppConfig = app.config["APP_CONFIG"]
        self._app = app
        self._interval = config.WORKFLOW_REAPER_INTERVAL if interval is None else interval
        self._retention_interval = config.DURABLE_STREAM_RETENTION_INTERVAL if retention else 0
        self._durable = config.WORKFLOW_EVENT_TRANSPORT == "durable_stream"
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workflow-reaper", daemon=True)

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def enabled(self) -> bool:
        return self._interval > 0

    def start(self) -> None:
        if self.enabled:
            self._thread.start()
            logger.info("reaper: sweeping every %g s", self._interval)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        next_retention = time.monotonic() + self._retention_interval
        while not self._stopped.wait(self._interval * random.uniform(0.8, 1.2)):
            with self._app.app_context():
                self._sweep()
                if self._durable and self._retention_interval > 0 and time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + self._retention_interval
                    self._enforce_retention()

    def _sweep(self) -> None:

        try:
            report = reap()
            if report:
                logger.warning("reaper: %s", report)
        except Exception:  # the database or the stream store is away: try again next time
            logger.exception("reaper: the sweep failed")
        finally:
            db.session.remove()
        self._sweep_forms_and_keys()

    def _sweep_forms_and_keys(self) -> None:
        try:
            expired = human_input_service.expire_overdue()
            if expired:
                logger.warning("reaper: %d human-input form(s) expired", expired)
            idempotency.purge_expired()
            worker_heartbeats.forget_older_than(time.time() - HEARTBEAT_MEMORY)
        except Exception:
            logger.exception("reaper: the sweep of forms, idempotency keys and heartbeats failed")
        finally:
            db.session.remove()

    def _enforce_retention(self) -> None:
        try:
            enforce_retention()
        except Exception:
            logger.exception("reaper: enforce_retention() failed")


def start_in_api_worker(app: Flask) -> Reaper | None:
    """Run a reaper in this API worker process (gunicorn's ``post_worker_init``), so that runs end
    whether or not any Celery worker is alive: every ``API_REAPER_INTERVAL`` seconds, without retention."""
    config: AppConfig = app.config["APP_CONFIG"]
    reaper = Reaper(app, interval=config.API_REAPER_INTERVAL, retention=False)
    if not reaper.enabled:
        return None
    reaper.start()
    return reaper


def init_worker(app: Flask) -> None:
    """Run a reaper in this Celery worker process from the moment it is ready until it shuts down."""
    from celery import signals

    reaper = Reaper(app)

    def started(**_: object) -> None:
        reaper.start()

    def stopping(**_: object) -> None:
        reaper.stop()

    signals.worker_ready.connect(started, weak=False)
    signals.worker_shutting_down.connect(stopping, weak=False)
