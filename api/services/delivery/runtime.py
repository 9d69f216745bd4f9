"""What one process keeps for the event streams it serves: built once, where the process starts.

:class:`DeliveryRuntime` holds the process's resume-token codec, the event transport its streams
read through, its admission gate, its run watcher (one thread checking every watched run), its
shared writers and their ending lane. ``create_app`` builds it and puts it in ``app.extensions`` (:func:`init_app`), so
nothing is made lazily on a first request; the HTTP edge gets it with :func:`current_runtime`.

Its rules, in one place:

- **Fork.** gunicorn (without ``--preload``) and Celery's prefork pool build the app in each
  process, after the fork: the runtime is never inherited. Nothing in it starts a thread or a
  greenlet when it is built: the watcher's thread starts on the first watched stream (and again
  in a process that finds it not alive, e.g. one forked after it started), a writer's greenlet
  with its first client, the ending lane's when something ends, the admission's loop-lag probe
  with the first stream it admits.
- **Connections.** The transport is the process's ``ext_event_bus`` extension, which the Celery
  tasks (the producers) share: it connects on first use and again in a process that finds its
  connection inherited from its parent (it checks the pid), for the same fork rule. The runtime
  hands out whichever connection is current (:attr:`DeliveryRuntime.transport`).
- **gevent.** Under gunicorn's gevent workers the watcher's "thread" is a greenlet (the process is
  monkey-patched before the app is built); the writers and the lane run on the hub's one thread and
  need no locks. The shared writers are used only there (``writer.writable_socket``).
- **Threads.** Elsewhere (the Flask test client, a threaded server) streams read alone; the watcher
  is a real thread and takes its lock.
"""

from __future__ import annotations

import logging

from flask import Flask, current_app

from api.configs import AppConfig
from api.core.app.apps.event_transport import WorkflowEventTransport
from api.extensions.ext_event_bus import EXTENSION_KEY as EVENTS_KEY
from api.extensions.ext_event_bus import EventTransportExtension
from api.libs.resume_token import ResumeTokenCodec, development_key, parse_keys

from . import streams
from . import watcher as watcher_module
from .admission import Admission
from .watcher import RunWatcher
from .writer import SharedWriters

EXTENSION_KEY = "delivery"
logger = logging.getLogger(__name__)


class DeliveryRuntime:
    def __init__(self, app: Flask, config: AppConfig, events: EventTransportExtension) -> None:
        self._config = config
        self._events = events
        #: Seals and opens the resume tokens of this deployment (``RESUME_TOKEN_KEYS``; without them a
        #: development key derived from ``SECRET_KEY``, see README.md).
        self.tokens = ResumeTokenCodec(parse_keys(config.RESUME_TOKEN_KEYS) or [development_key(config.SECRET_KEY)])
        interval = max(0.5, config.WORKFLOW_LEASE_TTL / 3)
        self.watcher = RunWatcher(app, interval=interval, grace=config.WORKFLOW_END_RETRY_DEADLINE + interval)
        self.writers = SharedWriters(
            app,
            self.watcher,
            ping_interval=config.SSE_PING_INTERVAL,
            idle_timeout=config.SSE_IDLE_TIMEOUT,
            history=config.SSE_WRITER_HISTORY,
        )
        self.admission = Admission(
            max_starting=config.SSE_MAX_STARTING,
            max_lag=config.SSE_MAX_LOOP_LAG,
            retry_after_max=config.SSE_BUSY_RETRY_AFTER_MAX,
        )

    @property
    def transport(self) -> WorkflowEventTransport:
        """The transport the streams read through (its current connection: see the module's rules)."""
        return self._events.transport

    def drain(self) -> None:
        """The process is going away (SIGTERM, a reload): end every open stream with a ``retry:``.

        The writers' clients first (each gets its ``retry:`` from its writer), then every stream that
        reads alone and every writer's subscription (the watcher closes them; each stream ends with
        its own ``retry:``); a stream that starts after this ends at once. The clients resume with
        ``Last-Event-ID`` on another process; the server's drain then finds no connection left.
        """
        writers = self.writers.drain(lambda: streams.drain_retry_ms(self._config))
        drained = self.watcher.drain()
        logger.info("draining: %d writer(s) and %d stream(s) told their clients to come back", writers, drained)


def init_app(app: Flask, config: AppConfig) -> DeliveryRuntime:
    """Needs ``ext_event_bus`` initialised first."""
    built = DeliveryRuntime(app, config, app.extensions[EVENTS_KEY])
    app.extensions[EXTENSION_KEY] = built
    # For the modules the runtime's own parts import (the writers import the streams and the watcher).
    app.extensions[watcher_module.EXTENSION_KEY] = built.watcher
    app.extensions[streams.TRANSPORT_KEY] = lambda: built.transport
    return built


def current_runtime() -> DeliveryRuntime:
    """The current app's runtime."""
    built: DeliveryRuntime = current_app.extensions[EXTENSION_KEY]
    return built
