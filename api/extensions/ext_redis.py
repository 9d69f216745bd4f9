"""An optional Redis client (``REDIS_URL``), used by the broadcast channel when configured.

Its pool is a blocking one of ``REDIS_MAX_CONNECTIONS`` connections: every open broadcast event
stream holds one for its whole life, so the pool bounds the streams one process can serve. When it
is exhausted a caller waits at most ``REDIS_POOL_TIMEOUT`` seconds for a connection and then gets a
``redis.ConnectionError`` that the event transport turns into a 503 ``event_stream_busy`` (redis-py's
default pool would instead fail at once, at 100 connections, with an error the API answered as 500).
"""

from __future__ import annotations

from flask import Flask
from redis import BlockingConnectionPool, Redis

from api.configs import AppConfig


def init_app(app: Flask, config: AppConfig) -> None:
    client: Redis | None = None
    if config.REDIS_URL:
        pool = BlockingConnectionPool.from_url(
            config.REDIS_URL, max_connections=config.REDIS_MAX_CONNECTIONS, timeout=config.REDIS_POOL_TIMEOUT
        )
        client = Redis(connection_pool=pool)
    app.extensions["redis"] = client
