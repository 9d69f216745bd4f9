"""Whether this process can serve: its database, its event stream store and its task queue.

Each dependency is asked one cheap question with a short deadline, all of them at once, so a
readiness probe answers within about :data:`CHECK_TIMEOUT` whatever is down. What failed is named
in the answer; why goes to the log.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

from flask import Flask, current_app
from sqlalchemy import text

from api.configs import AppConfig
from api.extensions.ext_durable_stream import durable_stream
from api.models.engine import db

logger = logging.getLogger(__name__)

#: Seconds each dependency has to answer.
CHECK_TIMEOUT = 2.0
#: The topic the stream store is asked about (it need not exist).
PROBE_TOPIC = "health-probe"


def _database() -> None:
    with db.engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def _stream_store() -> None:
    config: AppConfig = current_app.config["APP_CONFIG"]
    if config.WORKFLOW_EVENT_TRANSPORT == "durable_stream":
        durable_stream().admin.topic_info(PROBE_TOPIC)
    else:
        redis = current_app.extensions["redis"]
        redis.ping()


def _broker() -> None:
    celery_app = current_app.extensions["celery"]
    with celery_app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, timeout=CHECK_TIMEOUT)


CHECKS: dict[str, Callable[[], None]] = {"database": _database, "stream_store": _stream_store, "broker": _broker}


def readiness(app: Flask) -> dict[str, str]:
    """Each dependency's state: ``ok``, ``unavailable`` (it failed) or ``timeout`` (no answer in time)."""

    def run(check: Callable[[], None]) -> None:
        with app.app_context():
            try:
                check()
            finally:
                db.session.remove()

    states: dict[str, str] = {}
    pool = concurrent.futures.ThreadPoolExecutor(len(CHECKS), thread_name_prefix="health")
    try:
        futures = {name: pool.submit(run, check) for name, check in CHECKS.items()}
        for name, future in futures.items():
            try:
                future.result(timeout=CHECK_TIMEOUT)
                states[name] = "ok"
            except concurrent.futures.TimeoutError:
                states[name] = "timeout"
                logger.warning("readiness: the %s did not answer within %g s", name, CHECK_TIMEOUT)
            except Exception as exc:
                states[name] = "unavailable"
                logger.warning("readiness: the %s is unavailable: %s", name, exc)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung check must not hold the answer
    return states
