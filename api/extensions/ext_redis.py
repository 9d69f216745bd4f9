"""An optional Redis client (``REDIS_URL``), used by the broadcast channel when configured."""

from __future__ import annotations

from flask import Flask
from redis import Redis

from api.configs import AppConfig


def init_app(app: Flask, config: AppConfig) -> None:
    client: Redis | None = None
    if config.REDIS_URL:
        client = Redis.from_url(config.REDIS_URL)
    app.extensions["redis"] = client
