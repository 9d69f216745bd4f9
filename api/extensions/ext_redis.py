"""An optional Redis client (``REDIS_URL``), used by the broadcast channel when configured."""

from __future__ import annotations

from typing import Any

from flask import Flask

from api.configs import AppConfig


def init_app(app: Flask, config: AppConfig) -> None:
    client: Any = None
    if config.REDIS_URL:
        import redis

        client = redis.Redis.from_url(config.REDIS_URL)
    app.extensions["redis"] = client
