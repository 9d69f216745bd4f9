"""Application settings, read from the environment (and an optional ``.env`` file).

Each process builds one :class:`AppConfig` in ``create_app()``. Dify's own settings are read under
Dify's names (:mod:`.dify`), ours under ours (:mod:`.service`, :mod:`.limits`); what they resolve to is
:mod:`.resolve`, what a process refuses to start with is :mod:`.checks`, and ``flask config check``
prints :mod:`.report`. ``docs/configuration.md`` is generated from these models (``make docs``).

``DEPLOY_ENV`` is ``PRODUCTION`` unless set (as in Dify). Only ``DEVELOPMENT`` (``make run``) falls back
to the embedded setup (SQLite for data and streams and Celery's filesystem broker under ``VAR_DIR``)
and starts on the built-in ``SECRET_KEY``.
"""

from __future__ import annotations

import pathlib
from typing import Any

from pydantic import ValidationError

from . import resolve
from .model import Settings
from .redis_target import ConfigurationError, RedisTarget
from .service import DEVELOPMENT_SECRET_KEY, PROJECT_ROOT

__all__ = ["DEVELOPMENT_SECRET_KEY", "PROJECT_ROOT", "AppConfig", "ConfigurationError", "RedisTarget", "load_config"]


class AppConfig(Settings):
    """Every setting, and what the ones that name the same thing in two ways resolve to."""

    def database_uri(self) -> str:
        """Raises:
        ConfigurationError: see :func:`api.configs.resolve.database`."""
        return resolve.database(self).value

    def durable_stream_url(self) -> str:
        """Raises:
        ConfigurationError: see :func:`api.configs.resolve.stream_store`."""
        return resolve.stream_store(self).value

    def broker_url(self) -> str:
        """Raises:
        ConfigurationError: see :func:`api.configs.resolve.broker`."""
        return resolve.broker(self).value

    def broker_transport_options(self) -> dict[str, Any]:
        return resolve.broker_transport_options(self)

    def broker_ssl_options(self) -> dict[str, Any] | None:
        return resolve.broker_ssl_options(self)

    def redis(self) -> RedisTarget | None:
        """The app's Redis (``REDIS_URL`` or Dify's ``REDIS_*``), or ``None``.

        Raises:
            ConfigurationError: see :func:`api.configs.resolve.main_redis`."""
        found = resolve.main_redis(self)
        return None if found is None else found[0]

    def event_bus_redis(self) -> RedisTarget | None:
        """The broadcast channel's Redis (``EVENT_BUS_REDIS_URL``, else the app's), or ``None``.

        Raises:
            ConfigurationError: see :func:`api.configs.resolve.event_bus_redis`."""
        found = resolve.event_bus_redis(self)
        return None if found is None else found[0]

    def broker_folder(self) -> pathlib.Path:
        return self.VAR_DIR / "broker"

    def demo_page_enabled(self) -> bool:
        if self.DEMO_PAGE_ENABLED is not None:
            return self.DEMO_PAGE_ENABLED
        return self.development


def load_config() -> AppConfig:
    """The settings from the environment and ``.env``.

    Raises:
        ConfigurationError: A value does not parse (one line per setting; values are never echoed).
    """
    try:
        return AppConfig()
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            name = ".".join(str(part) for part in error["loc"]) or "settings"
            lines.append(f"{name}: {error['msg']}")
        raise ConfigurationError("\n".join(lines)) from None
