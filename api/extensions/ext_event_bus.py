"""The rollout flag: which transport carries workflow events (``WORKFLOW_EVENT_TRANSPORT``).

One transport per process, made on first use and made again after a fork, like the durable-stream
backend it wraps (:mod:`api.extensions.ext_durable_stream`): Celery's prefork pool and gunicorn
fork after the app is created, and a broadcast channel (its connections and listener threads) must
never cross a fork either.
"""

from __future__ import annotations

import os
import threading

from flask import Flask, current_app
from redis import Redis

from api.configs import AppConfig, ConfigurationError
from api.core.app.apps.event_transport import BroadcastEventTransport, DurableEventTransport, WorkflowEventTransport
from api.core.durable_stream import DurableStreamBackend
from api.extensions.ext_durable_stream import DurableStreamExtension

EXTENSION_KEY = "event_transport"


class EventTransportExtension:
    def __init__(self, config: AppConfig, durable: DurableStreamExtension, redis_client: Redis | None) -> None:
        self._config = config
        self._durable = durable
        self._redis = redis_client
        self._transport: WorkflowEventTransport | None = None
        self._backend: DurableStreamBackend | None = None
        self._pid = 0
        self._lock = threading.Lock()

    @property
    def transport(self) -> WorkflowEventTransport:
        with self._lock:
            if self._config.WORKFLOW_EVENT_TRANSPORT == "durable_stream":
                # The backend extension re-opens a closed or inherited backend: follow it.
                backend = self._durable.backend
                if self._transport is None or backend is not self._backend:
                    self._transport, self._backend = DurableEventTransport(backend), backend
            elif self._transport is None or self._pid != os.getpid():
                self._transport = self._broadcast()
            self._pid = os.getpid()
            return self._transport

    def _broadcast(self) -> WorkflowEventTransport:
        from api.core.broadcast_channel import create_broadcast_channel

        assert self._redis is not None, "checked by init_app"
        channel = create_broadcast_channel(
            self._redis,
            self._config.BROADCAST_CHANNEL_TYPE,
            stream_ttl_seconds=self._config.PUBSUB_STREAMS_RETENTION_SECONDS,
        )
        return BroadcastEventTransport(channel)


def init_app(app: Flask, config: AppConfig) -> None:
    """Needs ``ext_durable_stream`` and ``ext_redis`` initialised first.

    Raises:
        ConfigurationError: The broadcast channel is chosen without a Redis for it.
    """
    if config.WORKFLOW_EVENT_TRANSPORT == "broadcast_channel" and app.extensions["redis"] is None:
        raise ConfigurationError(
            "WORKFLOW_EVENT_TRANSPORT=broadcast_channel needs a Redis: set EVENT_BUS_REDIS_URL, REDIS_URL or "
            "Dify's REDIS_HOST"
        )
    app.extensions[EXTENSION_KEY] = EventTransportExtension(
        config, app.extensions["durable_stream"], app.extensions["redis"]
    )


def event_transport() -> WorkflowEventTransport:
    extension: EventTransportExtension = current_app.extensions[EXTENSION_KEY]
    return extension.transport
