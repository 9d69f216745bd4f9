"""What one process keeps for the event streams it serves: built once, where the process starts.

:class:`DeliveryRuntime` holds the process's run watcher (one thread checking every watched run),
its shared writers and their ending lane. ``create_app`` builds it and puts it in
``app.extensions`` (:func:`init_app`), so nothing is made lazily on a first request.

Its rules, in one place:

- **Fork.** gunicorn (without ``--preload``) and Celery's prefork pool build the app in each
  process, after the fork: the runtime is never inherited. Nothing in it starts a thread or a
  greenlet when it is built: the watcher's thread starts on the first watched stream (and again
  in a process that finds it not alive, e.g. one forked after it started), a writer's greenlet
  with its first client, the ending lane's when something ends.
- **gevent.** Under gunicorn's gevent workers the watcher's "thread" is a greenlet (the process is
  monkey-patched before the app is built); the writers and the lane run on the hub's one thread and
  need no locks. The shared writers are used only there (``writer.writable_socket``).
- **Threads.** Elsewhere (the Flask test client, a threaded server) streams read alone; the watcher
  is a real thread and takes its lock.

The process's connections it reads through are extensions, not part of it: the event transport
(``ext_event_bus``, over the durable-stream backend of ``ext_durable_stream``) and the resume-token
codec (``ext_resume_token``); those open on first use and again in a process that finds them
inherited from its parent (they check the pid), for the same fork rule.
"""

from __future__ import annotations

import logging

from flask import Flask, current_app

from api.configs import AppConfig

from . import watcher as watcher_module
from .streams import drain_retry_ms
from .watcher import RunWatcher
from .writer import SharedWriters

EXTENSION_KEY = "delivery"
logger = logging.getLogger(__name__)


class DeliveryRuntime:
    def __init__(self, app: Flask, config: AppConfig) -> None:
        self._config = config
        interval = max(0.5, config.WORKFLOW_LEASE_TTL / 3)
        self.watcher = RunWatcher(app, interval=interval, grace=config.WORKFLOW_END_RETRY_DEADLINE + interval)
        self.writers = SharedWriters(
            app, self.watcher, ping_interval=config.SSE_PING_INTERVAL, idle_timeout=config.SSE_IDLE_TIMEOUT
        )

    def drain(self) -> None:
        """The process is going away (SIGTERM, a reload): end every open stream with a ``retry:``.

        The writers' clients first (each gets its ``retry:`` from its writer), then every stream that
        reads alone and every writer's subscription (the watcher closes them; each stream ends with
        its own ``retry:``); a stream that starts after this ends at once. The clients resume with
        ``Last-Event-ID`` on another process; the server's drain then finds no connection left.
        """
        writers = self.writers.drain(lambda: drain_retry_ms(self._config))
        streams = self.watcher.drain()
        logger.info("draining: %d writer(s) and %d stream(s) told their clients to come back", writers, streams)


def init_app(app: Flask, config: AppConfig) -> DeliveryRuntime:
    built = DeliveryRuntime(app, config)
    app.extensions[EXTENSION_KEY] = built
    app.extensions[watcher_module.EXTENSION_KEY] = built.watcher  # for the streams, which the writer imports
    return built


def current_runtime() -> DeliveryRuntime:
    """The current app's runtime."""
    built: DeliveryRuntime = current_app.extensions[EXTENSION_KEY]
    return built
