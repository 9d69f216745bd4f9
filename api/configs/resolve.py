"""What the settings resolve to: the app database, the stream store, the broker and the Redis deployments.

Each thing can be given by a URL of ours or by Dify's parts; with both, every Dify part that was set
must agree with the URL (else :class:`ConfigurationError`, one line naming both). Nothing falls back
to the embedded SQLite or the filesystem broker except with ``DEPLOY_ENV=DEVELOPMENT``: elsewhere a
missing choice is an error naming the setting to set (``sqlite:///…`` or ``filesystem://`` chooses the
embedded ones explicitly). Every answer carries its source, for ``flask config check``.
"""

from __future__ import annotations

import dataclasses
import ssl
import urllib.parse
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .dify import DB_PART_FIELDS, REDIS_PART_FIELDS
from .model import Settings
from .redis_target import ConfigurationError, RedisTarget, host_ports, mask_url

__all__ = [
    "Resolved",
    "broker",
    "broker_ssl_options",
    "broker_transport_options",
    "database",
    "event_bus_redis",
    "main_redis",
    "stream_store",
]

_CERT_REQS = {"CERT_NONE": "none", "CERT_OPTIONAL": "optional", "CERT_REQUIRED": "required"}
_REDIS_FLAGS = ("REDIS_USE_SSL", "REDIS_USE_SENTINEL", "REDIS_USE_CLUSTERS")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A resolved value (secrets included) and where it came from, in words."""

    value: str
    source: str

    def masked(self) -> str:
        return mask_url(self.value)


def _parts_given(config: Settings, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if config.given(name)]


def _redis_parts(config: Settings) -> list[str]:
    """The Dify ``REDIS_*`` parts that were set; a flag set to false alone does not ask for a Redis."""
    given = _parts_given(config, REDIS_PART_FIELDS)
    if all(name in _REDIS_FLAGS and not getattr(config, name) for name in given):
        return []
    return given


def _ssl_options(config: Settings) -> tuple[tuple[str, str], ...]:
    options = [("ssl_cert_reqs", _CERT_REQS[config.REDIS_SSL_CERT_REQS])]
    for name, setting in (
        ("ssl_ca_certs", config.REDIS_SSL_CA_CERTS),
        ("ssl_certfile", config.REDIS_SSL_CERTFILE),
        ("ssl_keyfile", config.REDIS_SSL_KEYFILE),
    ):
        if setting:
            options.append((name, setting))
    return tuple(options)


def redis_from_parts(config: Settings) -> RedisTarget:
    """Dify's ``REDIS_*`` as one deployment, with Dify's rules (Sentinel or cluster, never both).

    Raises:
        ConfigurationError: Both modes at once, or a mode without its nodes or service name.
    """
    common: dict[str, Any] = {
        "username": config.REDIS_USERNAME or None,
        "password": config.REDIS_PASSWORD or None,
        "tls": config.REDIS_USE_SSL,
        "ssl_options": _ssl_options(config) if config.REDIS_USE_SSL else (),
    }
    if config.REDIS_USE_SENTINEL and config.REDIS_USE_CLUSTERS:
        raise ConfigurationError("REDIS_USE_SENTINEL and REDIS_USE_CLUSTERS are both true: choose one")
    if config.REDIS_USE_SENTINEL:
        sentinels = host_ports(config.REDIS_SENTINELS, "REDIS_SENTINELS")
        if not sentinels:
            raise ConfigurationError("REDIS_USE_SENTINEL is true but REDIS_SENTINELS is empty")
        if not config.REDIS_SENTINEL_SERVICE_NAME:
            raise ConfigurationError("REDIS_USE_SENTINEL is true but REDIS_SENTINEL_SERVICE_NAME is empty")
        return RedisTarget(
            "sentinel",
            db=config.REDIS_DB,
            sentinels=sentinels,
            service=config.REDIS_SENTINEL_SERVICE_NAME,
            sentinel_username=config.REDIS_SENTINEL_USERNAME or None,
            sentinel_password=config.REDIS_SENTINEL_PASSWORD or None,
            sentinel_socket_timeout=config.REDIS_SENTINEL_SOCKET_TIMEOUT,
            **common,
        )
    if config.REDIS_USE_CLUSTERS:
        nodes = host_ports(config.REDIS_CLUSTERS, "REDIS_CLUSTERS")
        if not nodes:
            raise ConfigurationError("REDIS_USE_CLUSTERS is true but REDIS_CLUSTERS is empty")
        common["password"] = config.REDIS_CLUSTERS_PASSWORD or common["password"]
        return RedisTarget("cluster", nodes=nodes, **common)
    return RedisTarget("standalone", host=config.REDIS_HOST, port=config.REDIS_PORT, db=config.REDIS_DB, **common)


def _shown(config: Settings, name: str) -> str:
    value = getattr(config, name)
    if "PASSWORD" in name:
        return "***"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _redis_disagreement(config: Settings, url_target: RedisTarget, given: list[str]) -> str | None:
    """The first Dify part that names something else than ``REDIS_URL``, or ``None``."""
    parts = redis_from_parts(config)
    checks: dict[str, bool] = {
        "REDIS_USE_SENTINEL": (url_target.mode == "sentinel") == config.REDIS_USE_SENTINEL,
        "REDIS_USE_CLUSTERS": (url_target.mode == "cluster") == config.REDIS_USE_CLUSTERS,
        "REDIS_USE_SSL": url_target.tls == config.REDIS_USE_SSL,
        "REDIS_USERNAME": url_target.username == parts.username,
        "REDIS_PASSWORD": url_target.password == parts.password,
        "REDIS_CLUSTERS_PASSWORD": url_target.password == parts.password,
    }
    if parts.mode == "standalone":
        checks |= {
            "REDIS_HOST": url_target.host == parts.host,
            "REDIS_PORT": url_target.port == parts.port,
            "REDIS_DB": url_target.db == parts.db,
        }
    elif parts.mode == "sentinel":
        checks |= {
            "REDIS_SENTINELS": set(url_target.sentinels) == set(parts.sentinels),
            "REDIS_SENTINEL_SERVICE_NAME": url_target.service == parts.service,
            "REDIS_DB": url_target.db == parts.db,
        }
    else:
        checks["REDIS_CLUSTERS"] = set(url_target.nodes) == set(parts.nodes)
    return next((name for name in given if not checks.get(name, True)), None)


def main_redis(config: Settings) -> tuple[RedisTarget, str] | None:
    """The app's Redis: ``REDIS_URL``, or Dify's ``REDIS_*`` parts; ``None`` when neither is set.

    Raises:
        ConfigurationError: The parts are inconsistent, or disagree with ``REDIS_URL``.
    """
    given = _redis_parts(config)
    if config.REDIS_URL:
        target = RedisTarget.from_url(config.REDIS_URL, "REDIS_URL")
        if given and (name := _redis_disagreement(config, target, given)) is not None:
            raise ConfigurationError(
                f"REDIS_URL ({mask_url(config.REDIS_URL)}) and {name}={_shown(config, name)} disagree: "
                "unset one of them, or make both name the same Redis"
            )
        return target, "REDIS_URL"
    if given:
        return redis_from_parts(config), "Dify's " + ", ".join(given)
    return None


def event_bus_redis(config: Settings) -> tuple[RedisTarget, str] | None:
    """The broadcast channel's Redis: ``EVENT_BUS_REDIS_URL`` (Dify's), else the app's Redis.

    Raises:
        ConfigurationError: See :func:`main_redis`; or ``EVENT_BUS_REDIS_URL`` is not a Redis URL.
    """
    if config.PUBSUB_REDIS_URL and config.PUBSUB_REDIS_URL.strip():
        target = RedisTarget.from_url(
            config.PUBSUB_REDIS_URL, "EVENT_BUS_REDIS_URL", cluster=config.PUBSUB_REDIS_USE_CLUSTERS
        )
        return target, "EVENT_BUS_REDIS_URL"
    return main_redis(config)


def _database_url_from_parts(config: Settings) -> str:
    extras = f"{config.DB_EXTRAS}&client_encoding={config.DB_CHARSET}" if config.DB_CHARSET else config.DB_EXTRAS
    url = URL.create(
        "postgresql+psycopg",
        username=config.DB_USERNAME,
        password=config.DB_PASSWORD or None,
        host=config.DB_HOST,
        port=config.DB_PORT,
        database=config.DB_DATABASE,
        query=dict(urllib.parse.parse_qsl(extras.strip("&"))),
    )
    return url.render_as_string(hide_password=False)


def database(config: Settings) -> Resolved:
    """The app database: ``SQLALCHEMY_DATABASE_URI``, Dify's ``DB_*``, or (development only) SQLite.

    Raises:
        ConfigurationError: ``DB_TYPE`` is not postgresql, the two forms disagree, or nothing is set outside
            development.
    """
    given = _parts_given(config, DB_PART_FIELDS)
    if config.given("DB_TYPE") and config.DB_TYPE.strip().lower() != "postgresql":
        raise ConfigurationError(
            f"DB_TYPE={config.DB_TYPE}: this service stores its data in PostgreSQL only "
            "(set DB_TYPE=postgresql and DB_*, or SQLALCHEMY_DATABASE_URI)"
        )
    uri = config.SQLALCHEMY_DATABASE_URI.strip()
    if uri:
        if given:
            _check_database_agreement(config, uri, given)
        return Resolved(uri, "SQLALCHEMY_DATABASE_URI")
    if given:
        return Resolved(_database_url_from_parts(config), "Dify's " + ", ".join(given))
    if config.development:
        return Resolved(
            f"sqlite:///{config.VAR_DIR / 'app.db'}", "the embedded SQLite in VAR_DIR (DEPLOY_ENV=DEVELOPMENT)"
        )
    raise ConfigurationError(
        f"no app database: set SQLALCHEMY_DATABASE_URI (sqlite:///… chooses the embedded one) or Dify's DB_HOST "
        f"and DB_* (DEPLOY_ENV={config.DEPLOY_ENV} never falls back to SQLite)"
    )


def _check_database_agreement(config: Settings, uri: str, given: list[str]) -> None:
    try:
        url = make_url(uri)
    except ArgumentError as exc:
        raise ConfigurationError("SQLALCHEMY_DATABASE_URI is not a database URL") from exc
    values: dict[str, object] = {
        "DB_TYPE": url.get_backend_name() == "postgresql",
        "DB_HOST": url.host == config.DB_HOST,
        "DB_PORT": (url.port or 5432) == config.DB_PORT,
        "DB_USERNAME": url.username == config.DB_USERNAME,
        "DB_PASSWORD": (url.password or "") == config.DB_PASSWORD,
        "DB_DATABASE": url.database == config.DB_DATABASE,
    }
    for name in given:
        if not values[name]:
            raise ConfigurationError(
                f"SQLALCHEMY_DATABASE_URI ({mask_url(uri)}) and {name}={_shown(config, name)} disagree: "
                "unset one of them, or make both name the same database"
            )


def stream_store(config: Settings) -> Resolved:
    """The stream store: ``DURABLE_STREAM_URL``, the app's Redis, or (development only) SQLite.

    Raises:
        ConfigurationError: See :func:`main_redis`; TLS to a cluster; or nothing is set outside development.
    """
    if config.DURABLE_STREAM_URL.strip():
        return Resolved(config.DURABLE_STREAM_URL.strip(), "DURABLE_STREAM_URL")
    found = main_redis(config)
    if found is not None:
        target, source = found
        if target.mode == "cluster" and target.tls:
            raise ConfigurationError(
                "the stream store does not reach a Redis Cluster over TLS (REDIS_USE_SSL with REDIS_USE_CLUSTERS): "
                "set DURABLE_STREAM_URL"
            )
        return Resolved(target.stream_url(), f"the app's Redis ({source})")
    if config.development:
        return Resolved(
            f"sqlite:///{config.VAR_DIR / 'streams.db'}", "the embedded SQLite in VAR_DIR (DEPLOY_ENV=DEVELOPMENT)"
        )
    raise ConfigurationError(
        "no stream store: set DURABLE_STREAM_URL (sqlite:///… chooses the embedded one), REDIS_URL, or Dify's "
        f"REDIS_HOST (or REDIS_USE_SENTINEL, REDIS_USE_CLUSTERS); DEPLOY_ENV={config.DEPLOY_ENV} never falls back "
        "to SQLite"
    )


def broker(config: Settings) -> Resolved:
    """Celery's broker: ``CELERY_BROKER_URL`` or (development only) the filesystem broker.

    Raises:
        ConfigurationError: Dify's Celery Sentinel settings are incomplete, or nothing is set outside development.
    """
    url = config.CELERY_BROKER_URL.strip()
    if config.CELERY_USE_SENTINEL:
        if not url.startswith("sentinel://"):
            shown = f"CELERY_BROKER_URL ({mask_url(url)})" if url else "CELERY_BROKER_URL is empty"
            raise ConfigurationError(
                f"CELERY_USE_SENTINEL is true but {shown}: list the sentinels as sentinel://[:password@]host:port/db"
            )
        if not config.CELERY_SENTINEL_MASTER_NAME:
            raise ConfigurationError("CELERY_USE_SENTINEL is true but CELERY_SENTINEL_MASTER_NAME is empty")
    elif url.startswith("sentinel://"):
        raise ConfigurationError("CELERY_BROKER_URL lists sentinels (sentinel://…) but CELERY_USE_SENTINEL is not true")
    if url:
        return Resolved(url, "CELERY_BROKER_URL")
    if config.development:
        return Resolved("filesystem://", "the embedded filesystem broker in VAR_DIR (DEPLOY_ENV=DEVELOPMENT)")
    raise ConfigurationError(
        f"no Celery broker: set CELERY_BROKER_URL (filesystem:// chooses the embedded one); "
        f"DEPLOY_ENV={config.DEPLOY_ENV} never falls back to it"
    )


def broker_transport_options(config: Settings) -> dict[str, Any]:
    """Dify's Sentinel options of the broker (kombu's ``master_name`` and ``sentinel_kwargs``)."""
    if not config.CELERY_USE_SENTINEL:
        return {}
    sentinel_kwargs: dict[str, Any] = {"socket_timeout": config.CELERY_SENTINEL_SOCKET_TIMEOUT}
    if config.CELERY_SENTINEL_PASSWORD:
        sentinel_kwargs["password"] = config.CELERY_SENTINEL_PASSWORD
    return {"master_name": config.CELERY_SENTINEL_MASTER_NAME, "sentinel_kwargs": sentinel_kwargs}


def broker_ssl_options(config: Settings) -> dict[str, Any] | None:
    """Dify's TLS options of a ``rediss://`` broker (from ``REDIS_SSL_*``), or ``None``."""
    if not config.CELERY_BROKER_URL.strip().startswith("rediss://"):
        return None
    cert_reqs = {"CERT_NONE": ssl.CERT_NONE, "CERT_OPTIONAL": ssl.CERT_OPTIONAL, "CERT_REQUIRED": ssl.CERT_REQUIRED}
    return {
        "ssl_cert_reqs": cert_reqs[config.REDIS_SSL_CERT_REQS],
        "ssl_ca_certs": config.REDIS_SSL_CA_CERTS,
        "ssl_certfile": config.REDIS_SSL_CERTFILE,
        "ssl_keyfile": config.REDIS_SSL_KEYFILE,
    }
