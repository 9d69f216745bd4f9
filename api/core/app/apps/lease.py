"""The worker's claim on a run: renewed while it executes, so a silent death is noticed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from flask import Flask

from . import run_store

logger = logging.getLogger(__name__)


class RunLease:
    """Renews ``lease_expires_at`` every third of the TTL until stopped, recording ``progress()`` (the
    last event the worker appended) with each renewal."""

    def __init__(
        self, app: Flask, run_id: str, ttl: float, progress: Callable[[], tuple[int, str] | None] = lambda: None
    ) -> None:
        self._app = app
        self._run_id = run_id
        self._ttl = ttl
        self._progress = progress
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._renew_forever, name=f"lease-{run_id}", daemon=True)

    def __enter__(self) -> RunLease:
        run_store.renew_lease(self._run_id, self._ttl)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _renew_forever(self) -> None:
        with self._app.app_context():
            while not self._stopped.wait(self._ttl / 3):
                try:
                    if not run_store.renew_lease(self._run_id, self._ttl, self._progress()):
                        return  # the run is no longer running: nothing left to hold
                except Exception:  # a missed renewal is retried; the TTL leaves room for two
                    logger.exception("could not renew the lease of run %s", self._run_id)
