"""One durable-stream backend per process, opened lazily.

Lazy and keyed by process id, because Celery's prefork pool and gunicorn fork after the app is
created: a backend (its connections and watcher thread) must never cross a fork.
"""

from __future__ import annotations

import os
import threading
import urllib.parse

from flask import Flask, current_app

from api.configs import AppConfig
from api.core.durable_stream import DurableStreamBackend, DurableStreamError, connect


class DurableStreamExtension:
    def __init__(self, url: str) -> None:
        self.url = url
        self._backend: DurableStreamBackend | None = None
        self._pid = 0
        self._lock = threading.Lock()

    @property
    def backend(self) -> DurableStreamBackend:
        with self._lock:
            if self._backend is None or self._pid != os.getpid() or self._backend.closed:
                self._backend = connect(self.url)
                self._pid = os.getpid()
            return self._backend

    def close(self) -> None:
        with self._lock:
            if self._backend is not None and self._pid == os.getpid():
                self._backend.close()
            self._backend = None


def init_app(app: Flask, config: AppConfig) -> None:
    from api.libs.external_api import STREAM_STORE_ERRORS

    app.extensions["durable_stream"] = DurableStreamExtension(stream_url_with_retention(config))
    if DurableStreamError not in STREAM_STORE_ERRORS:
        STREAM_STORE_ERRORS.append(DurableStreamError)


#: Redis URLs of one primary (not a cluster, whose adapter refuses ``wait_replicas``).
_ONE_PRIMARY = ("redis", "rediss", "redis+sentinel", "rediss+sentinel")


def stream_url_with_retention(config: AppConfig) -> str:
    """The stream URL, with the default retention added unless the URL chooses its own, and with
    ``DURABLE_STREAM_REDIS_WAIT_REPLICAS`` as the Redis adapter's ``wait_replicas`` (likewise)."""
    url = config.durable_stream_url()
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    added = []
    if "max_age_seconds" not in query and config.DURABLE_STREAM_MAX_AGE_SECONDS > 0:
        added.append(f"max_age_seconds={config.DURABLE_STREAM_MAX_AGE_SECONDS:g}")
    wait = config.DURABLE_STREAM_REDIS_WAIT_REPLICAS
    if wait > 0 and "wait_replicas" not in query and parts.scheme.lower() in _ONE_PRIMARY:
        added.append(f"wait_replicas={wait}")
    if not added:
        return url
    # Appended as text: re-assembling the URL would drop the empty host of sqlite:////absolute/path.
    return f"{url}{'&' if '?' in url else '?'}{'&'.join(added)}"


def retention_max_age(config: AppConfig) -> float | None:
    """Seconds after which retention removes a record, or ``None`` when records are kept for ever."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(stream_url_with_retention(config)).query)
    try:
        max_age = float(query["max_age_seconds"][-1])
    except (KeyError, IndexError, ValueError):
        return None
    return max_age if max_age > 0 else None


def durable_stream() -> DurableStreamBackend:
    extension: DurableStreamExtension = current_app.extensions["durable_stream"]
    return extension.backend
