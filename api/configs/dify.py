"""Dify's own settings, under Dify's names, with Dify's meanings and defaults (``docker/.env.example``,
``api/configs/`` of langgenius/dify).

An operator's ``.env`` written for Dify works as it is: the Redis by parts (standalone, Sentinel or
cluster), the event bus's Redis, Celery's Sentinel, the database by parts and ``DEPLOY_ENV``. What
they resolve to, and how they must agree with our URL forms of the same things, is
:mod:`api.configs.resolve`. Every field here has ``json_schema_extra={"dify": <its name>}``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings

__all__ = [
    "DB_PART_FIELDS",
    "DEPLOY_ENVS",
    "REDIS_PART_FIELDS",
    "DatabasePartsSettings",
    "DeploySettings",
    "DifySettings",
    "EventBusSettings",
    "RedisPartsSettings",
]

DEPLOY_ENVS = ("PRODUCTION", "TESTING", "DEVELOPMENT")
DeployEnv = Literal["PRODUCTION", "TESTING", "DEVELOPMENT"]


def _dify(name: str, *, secret: bool = False) -> JsonDict:
    extra: JsonDict = {"dify": name}
    if secret:
        extra["secret"] = True
    return extra


class DeploySettings(BaseSettings):
    DEPLOY_ENV: DeployEnv = Field(
        default="PRODUCTION",
        description="PRODUCTION (the default, as in Dify) and TESTING refuse to start on the built-in or a short "
        "SECRET_KEY and never fall back to the embedded SQLite or broker unless their URLs choose them; "
        "DEVELOPMENT (make run, bin/run) allows both and serves /demo.",
        json_schema_extra=_dify("DEPLOY_ENV"),
    )
    APP_MAX_ACTIVE_REQUESTS: int = Field(
        default=0,
        ge=0,
        description="Runs one app may have queued or running at once (across every process); a start beyond it is "
        "answered 429 with Retry-After. 0: no limit (Dify's default).",
        json_schema_extra=_dify("APP_MAX_ACTIVE_REQUESTS"),
    )

    @field_validator("DEPLOY_ENV", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value


class RedisPartsSettings(BaseSettings):
    """Dify's ``REDIS_*``: one server, the primary Sentinel names, or a cluster."""

    REDIS_HOST: str = Field(default="localhost", description="Redis host.", json_schema_extra=_dify("REDIS_HOST"))
    REDIS_PORT: int = Field(
        default=6379, ge=1, le=65535, description="Redis port.", json_schema_extra=_dify("REDIS_PORT")
    )
    REDIS_USERNAME: str | None = Field(
        default=None, description="Redis user (ACL).", json_schema_extra=_dify("REDIS_USERNAME")
    )
    REDIS_PASSWORD: str | None = Field(
        default=None, description="Redis password.", json_schema_extra=_dify("REDIS_PASSWORD", secret=True)
    )
    REDIS_DB: int = Field(default=0, ge=0, description="Redis database number.", json_schema_extra=_dify("REDIS_DB"))
    REDIS_USE_SSL: bool = Field(
        default=False, description="Reach Redis over TLS.", json_schema_extra=_dify("REDIS_USE_SSL")
    )
    REDIS_SSL_CERT_REQS: Literal["CERT_NONE", "CERT_OPTIONAL", "CERT_REQUIRED"] = Field(
        default="CERT_NONE",
        description="With REDIS_USE_SSL: how the server's certificate is checked.",
        json_schema_extra=_dify("REDIS_SSL_CERT_REQS"),
    )
    REDIS_SSL_CA_CERTS: str | None = Field(
        default=None,
        description="With REDIS_USE_SSL: CA certificates file.",
        json_schema_extra=_dify("REDIS_SSL_CA_CERTS"),
    )
    REDIS_SSL_CERTFILE: str | None = Field(
        default=None,
        description="With REDIS_USE_SSL: client certificate.",
        json_schema_extra=_dify("REDIS_SSL_CERTFILE"),
    )
    REDIS_SSL_KEYFILE: str | None = Field(
        default=None, description="With REDIS_USE_SSL: client key.", json_schema_extra=_dify("REDIS_SSL_KEYFILE")
    )
    REDIS_USE_SENTINEL: bool = Field(
        default=False,
        description="Ask Redis Sentinel (REDIS_SENTINELS) for the primary of REDIS_SENTINEL_SERVICE_NAME; REDIS_HOST "
        "and REDIS_PORT are then not used.",
        json_schema_extra=_dify("REDIS_USE_SENTINEL"),
    )
    REDIS_SENTINELS: str | None = Field(
        default=None,
        description="The sentinels: host:port,host:port,…",
        json_schema_extra=_dify("REDIS_SENTINELS"),
    )
    REDIS_SENTINEL_SERVICE_NAME: str | None = Field(
        default=None,
        description="The service the sentinels watch.",
        json_schema_extra=_dify("REDIS_SENTINEL_SERVICE_NAME"),
    )
    REDIS_SENTINEL_USERNAME: str | None = Field(
        default=None, description="The sentinels' own user.", json_schema_extra=_dify("REDIS_SENTINEL_USERNAME")
    )
    REDIS_SENTINEL_PASSWORD: str | None = Field(
        default=None,
        description="The sentinels' own password.",
        json_schema_extra=_dify("REDIS_SENTINEL_PASSWORD", secret=True),
    )
    REDIS_SENTINEL_SOCKET_TIMEOUT: float = Field(
        default=0.1,
        gt=0,
        description="Seconds each question to a sentinel may take.",
        json_schema_extra=_dify("REDIS_SENTINEL_SOCKET_TIMEOUT"),
    )
    REDIS_USE_CLUSTERS: bool = Field(
        default=False,
        description="Use the Redis Cluster of REDIS_CLUSTERS; REDIS_HOST, REDIS_PORT and REDIS_DB are then not used.",
        json_schema_extra=_dify("REDIS_USE_CLUSTERS"),
    )
    REDIS_CLUSTERS: str | None = Field(
        default=None, description="Cluster nodes: host:port,host:port,…", json_schema_extra=_dify("REDIS_CLUSTERS")
    )
    REDIS_CLUSTERS_PASSWORD: str | None = Field(
        default=None,
        description="The cluster's password (else REDIS_PASSWORD).",
        json_schema_extra=_dify("REDIS_CLUSTERS_PASSWORD", secret=True),
    )


class EventBusSettings(BaseSettings):
    """Dify's event bus: where the broadcast channel (``WORKFLOW_EVENT_TRANSPORT=broadcast_channel``) lives."""

    PUBSUB_REDIS_URL: str | None = Field(
        default=None,
        validation_alias=AliasChoices("EVENT_BUS_REDIS_URL", "PUBSUB_REDIS_URL"),
        description="The event bus's Redis (redis:// or rediss://; with EVENT_BUS_REDIS_USE_CLUSTERS a list of "
        "cluster nodes). Unset: the app's Redis (REDIS_URL or Dify's REDIS_*).",
        json_schema_extra=_dify("EVENT_BUS_REDIS_URL, PUBSUB_REDIS_URL", secret=True),
    )
    PUBSUB_REDIS_USE_CLUSTERS: bool = Field(
        default=False,
        validation_alias=AliasChoices(
            "EVENT_BUS_REDIS_USE_CLUSTERS", "EVENT_BUS_REDIS_CLUSTERS", "PUBSUB_REDIS_USE_CLUSTERS"
        ),
        description="EVENT_BUS_REDIS_URL names Redis Cluster nodes (redis://[:password@]host:port,host:port).",
        json_schema_extra=_dify("EVENT_BUS_REDIS_USE_CLUSTERS, EVENT_BUS_REDIS_CLUSTERS, PUBSUB_REDIS_USE_CLUSTERS"),
    )
    PUBSUB_STREAMS_RETENTION_SECONDS: int = Field(
        default=600,
        ge=1,
        validation_alias=AliasChoices("EVENT_BUS_STREAMS_RETENTION_SECONDS", "PUBSUB_STREAMS_RETENTION_SECONDS"),
        description="With the broadcast channel's 'streams' type: seconds a topic's stream is kept after its last "
        "event.",
        json_schema_extra=_dify("EVENT_BUS_STREAMS_RETENTION_SECONDS, PUBSUB_STREAMS_RETENTION_SECONDS"),
    )
    CELERY_USE_SENTINEL: bool = Field(
        default=False,
        description="CELERY_BROKER_URL lists sentinels (sentinel://[:password@]host:port/db;sentinel://…); the "
        "broker is the primary of CELERY_SENTINEL_MASTER_NAME.",
        json_schema_extra=_dify("CELERY_USE_SENTINEL"),
    )
    CELERY_SENTINEL_MASTER_NAME: str | None = Field(
        default=None,
        description="With CELERY_USE_SENTINEL: the service the sentinels watch.",
        json_schema_extra=_dify("CELERY_SENTINEL_MASTER_NAME"),
    )
    CELERY_SENTINEL_PASSWORD: str | None = Field(
        default=None,
        description="With CELERY_USE_SENTINEL: the sentinels' own password.",
        json_schema_extra=_dify("CELERY_SENTINEL_PASSWORD", secret=True),
    )
    CELERY_SENTINEL_SOCKET_TIMEOUT: float = Field(
        default=0.1,
        gt=0,
        description="With CELERY_USE_SENTINEL: seconds each question to a sentinel may take.",
        json_schema_extra=_dify("CELERY_SENTINEL_SOCKET_TIMEOUT"),
    )


class DatabasePartsSettings(BaseSettings):
    """Dify's ``DB_*``: the app database by parts (PostgreSQL only here)."""

    DB_TYPE: str = Field(
        default="postgresql",
        description="Only postgresql is served here (Dify's mysql, oceanbase and seekdb are refused at startup).",
        json_schema_extra=_dify("DB_TYPE"),
    )
    DB_HOST: str = Field(default="localhost", description="Database host.", json_schema_extra=_dify("DB_HOST"))
    DB_PORT: int = Field(default=5432, ge=1, le=65535, description="Database port.", json_schema_extra=_dify("DB_PORT"))
    DB_USERNAME: str = Field(default="postgres", description="Database user.", json_schema_extra=_dify("DB_USERNAME"))
    DB_PASSWORD: str = Field(
        default="", description="Database password.", json_schema_extra=_dify("DB_PASSWORD", secret=True)
    )
    DB_DATABASE: str = Field(default="dify", description="Database name.", json_schema_extra=_dify("DB_DATABASE"))
    DB_CHARSET: str = Field(
        default="", description="Client encoding (client_encoding).", json_schema_extra=_dify("DB_CHARSET")
    )
    DB_EXTRAS: str = Field(
        default="",
        description="Extra connection parameters as a query string, e.g. keepalives_idle=60&keepalives=1.",
        json_schema_extra=_dify("DB_EXTRAS"),
    )
    SQLALCHEMY_POOL_RECYCLE: int = Field(
        default=3600,
        ge=-1,
        description="Seconds after which a pooled app database connection is replaced (-1: never).",
        json_schema_extra=_dify("SQLALCHEMY_POOL_RECYCLE"),
    )
    SQLALCHEMY_POOL_PRE_PING: bool | None = Field(
        default=None,
        description="Test each pooled connection before use. Unset: on for PostgreSQL (a restarted database "
        "costs no failed request), off for SQLite.",
        json_schema_extra=_dify("SQLALCHEMY_POOL_PRE_PING (Dify's default: false)"),
    )


class DifySettings(DeploySettings, RedisPartsSettings, EventBusSettings, DatabasePartsSettings):
    """Every Dify-named setting."""


#: The Dify settings that describe the Redis by parts: any of them set (a flag set true) means the Redis is
#: given by parts, and each one set must agree with REDIS_URL when that is set too.
REDIS_PART_FIELDS = (
    "REDIS_HOST",
    "REDIS_PORT",
    "REDIS_USERNAME",
    "REDIS_PASSWORD",
    "REDIS_DB",
    "REDIS_USE_SSL",
    "REDIS_USE_SENTINEL",
    "REDIS_SENTINELS",
    "REDIS_SENTINEL_SERVICE_NAME",
    "REDIS_USE_CLUSTERS",
    "REDIS_CLUSTERS",
    "REDIS_CLUSTERS_PASSWORD",
)
DB_PART_FIELDS = ("DB_TYPE", "DB_HOST", "DB_PORT", "DB_USERNAME", "DB_PASSWORD", "DB_DATABASE")
