"""A Celery worker's heartbeat: proof that its consumer answers the broker, not only that it runs.

Every ``WORKER_HEARTBEAT_INTERVAL`` seconds a thread of the worker pings its own node through the
broker (Celery's remote-control ``ping``, addressed to this worker alone). The answer comes from the
loop that consumes the workflow tasks, over the same broker connection, and it comes even while every
pool thread is busy with a run: a worker that is merely busy is healthy, one whose consumer is stuck or
has lost its broker is not. Each answer is a heartbeat, written where each reader looks:

- the file ``VAR_DIR/worker-heartbeat-<node>`` (its modification time), which the container's
  healthcheck reads (``python -m api.healthcheck fresh VAR_DIR/worker-heartbeat SECONDS``);
- the ``worker_heartbeats`` row of the node, which ``/health/ready`` of every API process reads
  (``api.services.health``: 503 when work waits and no worker's heartbeat is recent).
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from typing import Any

from flask import Flask

from api.configs import AppConfig
from api.libs import metrics
from api.models.engine import db
from api.services import worker_heartbeats

logger = logging.getLogger(__name__)

#: Heartbeat files are this prefix followed by the node's name.
FILE_PREFIX = "worker-heartbeat-"


def heartbeat_file(config: AppConfig, node: str) -> pathlib.Path:
    return config.VAR_DIR / f"{FILE_PREFIX}{node.replace('/', '_')}"


class Heartbeat:
    """The heartbeat thread of the worker ``node``."""

    def __init__(self, app: Flask, node: str) -> None:
        config: AppConfig = app.config["APP_CONFIG"]
        self._app = app
        self._node = node
        self._interval = config.WORKER_HEARTBEAT_INTERVAL
        self._file = heartbeat_file(config, node)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-heartbeat", daemon=True)
        self.beats = 0

    def start(self) -> None:
        if self._interval > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._file.unlink(missing_ok=True)  # a worker that stops on purpose is not a stuck one

    def _run(self) -> None:
        while not self._stopped.is_set():
            began = time.monotonic()
            self.beat()
            self._stopped.wait(max(0.0, self._interval - (time.monotonic() - began)))

    def beat(self) -> bool:
        """Ping this worker's consumer once; on its answer, write the heartbeat. Returns whether it answered."""
        celery_app = self._app.extensions["celery"]
        timeout = max(1.0, min(5.0, self._interval))
        try:
            replies: list[dict[str, Any]] = celery_app.control.ping(destination=[self._node], timeout=timeout)
        except Exception as exc:  # the broker is away: no heartbeat, which is the point
            metrics.HEARTBEATS.tally.add(("failed",))
            logger.warning("worker heartbeat: could not ping this worker's consumer: %s", exc)
            return False
        if not any(self._node in reply for reply in replies):
            metrics.HEARTBEATS.tally.add(("failed",))
            logger.warning("worker heartbeat: this worker's consumer did not answer within %g s", timeout)
            return False
        metrics.HEARTBEATS.tally.add(("ok",))
        self.beats += 1
        try:
            self._file.parent.mkdir(parents=True, exist_ok=True)
            self._file.touch()
        except OSError as exc:
            logger.warning("worker heartbeat: could not write %s: %s", self._file, exc)
        with self._app.app_context():
            try:
                worker_heartbeats.record(self._node)
            except Exception as exc:  # the database is away: the file still tells the healthcheck
                logger.warning("worker heartbeat: could not record it in the database: %s", exc)
            finally:
                db.session.remove()
        return True


def init_worker(app: Flask) -> None:
    """Beat from the moment this Celery worker is ready until it shuts down."""
    from celery import signals

    started: list[Heartbeat] = []

    def ready(sender: Any = None, **_: object) -> None:
        node = getattr(sender, "hostname", None)
        if not node:
            logger.warning("worker heartbeat: the worker's node name is unknown; no heartbeat")
            return
        heartbeat = Heartbeat(app, node)
        started.append(heartbeat)
        heartbeat.start()

    def stopping(**_: object) -> None:
        for heartbeat in started:
            heartbeat.stop()

    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutting_down.connect(stopping, weak=False)
