"""One watch per process over the credentials its open event streams were opened with.

A rotated or revoked API key or passport must end the streams it opened, not only refuse new requests
(``api.services.credentials``): a stream can stay open for hours. Each open stream registers its
credential here with what ends it (:meth:`CredentialWatch.watch`); one thread (a greenlet under
gevent) asks every ``interval`` whether each distinct credential still holds
(``credentials.still_valid``: a dictionary look-up but once a second per process) and ends the streams
of one that does not. Such a stream ends with an ``error`` event ``key_revoked`` (401), whether it reads
alone or is served by its run's writer.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from flask import Flask

from ..credentials import Credential, still_valid

logger = logging.getLogger(__name__)

__all__ = ["KEY_REVOKED_MESSAGE", "CredentialWatch"]

KEY_REVOKED_MESSAGE = "the API key or passport this stream was opened with was revoked; authenticate again"


class CredentialWatch:
    """The credentials of this process's open streams, asked together once per ``interval``."""

    def __init__(self, app: Flask, *, interval: float) -> None:
        self._app = app
        self._interval = interval
        self._lock = threading.Lock()
        self._ends: dict[Credential, dict[int, Callable[[], None]]] = {}
        self._numbers = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, credential: Credential | None, end: Callable[[], None]) -> tuple[Credential, int] | None:
        """Call ``end()`` (once, from the watch's thread) if ``credential`` is revoked while watched; the
        handle to :meth:`unwatch` (``None`` for a stream opened without a credential)."""
        if credential is None:
            return None
        number = next(self._numbers)
        with self._lock:
            self._ends.setdefault(credential, {})[number] = end
            if self._thread is None or not self._thread.is_alive():  # none yet, stopped, or not forked
                self._thread = threading.Thread(target=self._run, name="credential-watch", daemon=True)
                self._thread.start()
        return credential, number

    def unwatch(self, handle: tuple[Credential, int] | None) -> None:
        if handle is None:
            return
        credential, number = handle
        with self._lock:
            ends = self._ends.get(credential)
            if ends is None:
                return
            ends.pop(number, None)
            if not ends:
                del self._ends[credential]

    def watched(self) -> int:
        """How many streams are watched (for tests and diagnostics)."""
        with self._lock:
            return sum(len(ends) for ends in self._ends.values())

    def _run(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                if not self._ends:
                    self._thread = None  # the next watch() starts another
                    return
            self.check()

    def check(self) -> None:
        """One pass over every watched credential; never raises (the next pass tries again)."""
        with self._lock:
            credentials = list(self._ends)
        with self._app.app_context():
            for credential in credentials:
                try:
                    valid = still_valid(credential)
                except Exception:  # the database is away: the last answer stands, the streams go on
                    logger.warning("could not check the credential of open event streams", exc_info=True)
                    continue
                if valid:
                    continue
                with self._lock:
                    ends = list(self._ends.pop(credential, {}).values())
                logger.info("a revoked credential ends %d open event stream(s) of app %s", len(ends), credential.app_id)
                for end in ends:
                    try:
                        end()
                    except Exception:  # one stream's trouble must not keep the others open
                        logger.warning("could not end a stream opened with a revoked credential", exc_info=True)
