"""Whether this process can serve: its database, its event stream store, its task queue, and a worker
that consumes it.

Every dependency is asked one cheap question, all of them at once, under one deadline
(``HEALTH_CHECK_TIMEOUT``): the answer comes within it however many of them hang. A check still
running from an earlier probe (a dependency that hangs for longer) is not asked again meanwhile; it
counts as ``timeout``, so probes do not pile up threads on a hung server. What failed is named in the
answer; why goes to the log.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable

from flask import Flask, current_app
from sqlalchemy import text

from api.configs import AppConfig
from api.core.app.apps import task_outbox
from api.extensions import filesystem_broker
from api.extensions.ext_durable_stream import durable_stream
from api.models.engine import db

from . import worker_heartbeats

logger = logging.getLogger(__name__)

#: The topic the stream store is asked about (it need not exist).
PROBE_TOPIC = "health-probe"


class NoWorkerConsumingError(Exception):
    """Task messages wait and no worker's consumer has answered within the bound."""


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def _database() -> None:
    with db.engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def _stream_store() -> None:
    if _config().WORKFLOW_EVENT_TRANSPORT == "durable_stream":
        durable_stream().admin.topic_info(PROBE_TOPIC)
    else:
        redis = current_app.extensions["redis"]
        redis.ping()


def _broker() -> None:
    """A real question for every broker: the filesystem broker's folder takes a message (kombu's connection
    to it always succeeds); a server broker is connected to (Redis answers a PING while connecting)."""
    config = _config()
    celery_app = current_app.extensions["celery"]
    if celery_app.conf.broker_url.startswith(filesystem_broker.ALIAS):
        filesystem_broker.probe(config.broker_folder() / "queue")
        return
    with celery_app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, timeout=config.HEALTH_CHECK_TIMEOUT)


def _workers() -> None:
    """Some worker consumes, or nothing waits for one.

    Raises:
        NoWorkerConsumingError: A message a broker accepted has waited ``WORKER_CONSUME_BOUND`` seconds
            and no worker's heartbeat is that recent.
    """
    bound = _config().WORKER_CONSUME_BOUND
    if bound <= 0:
        return
    now = time.time()
    waiting = task_outbox.waiting_since(now)
    if waiting is None or waiting > now - bound:
        return
    latest = worker_heartbeats.latest()
    if latest is None or latest < now - bound:
        raise NoWorkerConsumingError(f"a task has waited {now - waiting:.0f} s and no worker answered in {bound:g} s")


CHECKS: dict[str, Callable[[], None]] = {
    "database": _database,
    "stream_store": _stream_store,
    "broker": _broker,
    "workers": _workers,
}

_pool = concurrent.futures.ThreadPoolExecutor(2 * len(CHECKS), thread_name_prefix="health")
#: The last run of each check, per app (a test process holds several).
_running: dict[tuple[int, str], concurrent.futures.Future[None]] = {}
_lock = threading.Lock()


def _submit(app: Flask, name: str, check: Callable[[], None]) -> concurrent.futures.Future[None] | None:
    """Start ``check`` unless its previous run is still going (then ``None``)."""

    def run() -> None:
        with app.app_context():
            try:
                check()
            finally:
                db.session.remove()

    with _lock:
        previous = _running.get((id(app), name))
        if previous is not None and not previous.done():
            return None
        future = _running[(id(app), name)] = _pool.submit(run)
        return future


def readiness(app: Flask) -> dict[str, str]:
    """Each check's state: ``ok``, ``unavailable`` (it failed) or ``timeout`` (no answer in time)."""
    config: AppConfig = app.config["APP_CONFIG"]
    deadline = time.monotonic() + config.HEALTH_CHECK_TIMEOUT
    futures = {name: _submit(app, name, check) for name, check in CHECKS.items()}
    states: dict[str, str] = {}
    for name, future in futures.items():
        if future is None:
            states[name] = "timeout"
            logger.warning("readiness: the %s has still not answered an earlier check", name)
            continue
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
            states[name] = "ok"
        except concurrent.futures.TimeoutError:
            states[name] = "timeout"
            logger.warning("readiness: the %s did not answer within %g s", name, config.HEALTH_CHECK_TIMEOUT)
        except Exception as exc:
            states[name] = "unavailable"
            logger.warning("readiness: the %s is unavailable: %s", name, exc)
    return states
