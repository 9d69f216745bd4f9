"""Settings of the PostgreSQL adapter, parsed once from the URL and the connection options.

Also the names every module of the adapter shares: the URL form SQLAlchemy needs, and the schema
name rules (the name is interpolated into DDL, statements and channel names).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from ..._options import Options

__all__ = [
    "DEFAULT_SCHEMA",
    "LIBPQ_OPTIONS",
    "SYNCHRONOUS_COMMIT",
    "PostgresSettings",
    "quote_ident",
    "sqlalchemy_url",
    "validate_schema",
]

DEFAULT_SCHEMA = "durable_stream"
LIBPQ_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
SYNCHRONOUS_COMMIT = frozenset({"on", "off", "local", "remote_write", "remote_apply"})
_SCHEMES = ("postgresql+psycopg", "postgresql", "postgres")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def sqlalchemy_url(url: str) -> str:
    """Return ``url`` with the scheme SQLAlchemy needs to pick psycopg 3."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    return f"postgresql+psycopg://{rest}"


def validate_schema(name: str) -> str:
    """Accept plain identifiers only: the name is interpolated into DDL and channel names."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"option 'schema' must be a plain SQL identifier (letters, digits, _), got {name!r}")
    return name


def quote_ident(name: str) -> str:
    return '"' + validate_schema(name).replace('"', '""') + '"'


@dataclasses.dataclass(frozen=True, slots=True)
class PostgresSettings:
    #: The URL without its query string.
    url: str
    schema: str = DEFAULT_SCHEMA
    #: Records kept per topic, applied by every append (``None``: unlimited).
    max_records: int | None = None
    #: Age after which ``admin.enforce_retention()`` drops records and idle topics (``None``: never).
    max_age_seconds: float | None = None
    pool_size: int = 8
    max_overflow: int = 0
    pool_timeout: float = 10.0
    #: Seconds between the change feed's re-reads of all watched topics' heads.
    poll_interval: float = 1.0
    #: Send ``pg_notify`` hints after changes (the URL option ``notify``).
    send_hints: bool = True
    #: ``LISTEN`` for other processes' hints.
    listen: bool = True
    notify_channels: int = 16
    create_tables: bool = True
    retention_batch_size: int = 1000
    connect_timeout: float = 5.0
    application_name: str = "durable_stream"
    #: ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey`` as given.
    ssl: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: ``synchronous_commit`` for pooled connections, or ``None`` for the server's default.
    synchronous_commit: str | None = None

    @classmethod
    def from_url(cls, url: str, options: Options) -> PostgresSettings:
        synchronous_commit = options.pop_str("synchronous_commit")
        settings = cls(
            url=url,
            schema=validate_schema(options.pop_str("schema", DEFAULT_SCHEMA)),
            max_records=options.pop_int("max_records", minimum=1),
            max_age_seconds=options.pop_float("max_age_seconds", minimum=0.001),
            pool_size=options.pop_int("pool_size", 8, minimum=1),
            max_overflow=options.pop_int("max_overflow", 0, minimum=0),
            pool_timeout=options.pop_float("pool_timeout", 10.0, minimum=0.001),
            poll_interval=options.pop_float("poll_interval", 1.0, minimum=0.01),
            send_hints=options.pop_bool("notify", True),
            listen=options.pop_bool("listen", True),
            notify_channels=options.pop_int("notify_channels", 16, minimum=1),
            create_tables=options.pop_bool("create_tables", True),
            retention_batch_size=options.pop_int("retention_batch_size", 1000, minimum=1),
            connect_timeout=options.pop_float("connect_timeout", 5.0, minimum=1.0),
            application_name=options.pop_str("application_name", "durable_stream"),
            ssl={name: value for name in LIBPQ_OPTIONS if (value := options.pop_str(name)) is not None},
            synchronous_commit=synchronous_commit,
        )
        if synchronous_commit is not None and synchronous_commit not in SYNCHRONOUS_COMMIT:
            raise ValueError(f"option 'synchronous_commit' must be one of {sorted(SYNCHRONOUS_COMMIT)}")
        return settings

    def libpq_params(self) -> dict[str, Any]:
        """Connection parameters of every pooled connection."""
        params: dict[str, Any] = {
            "connect_timeout": max(1, round(self.connect_timeout)),
            "application_name": self.application_name,
            # A peer that vanished without closing (host down, partition) is noticed on idle
            # connections within about a minute instead of never.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
            **self.ssl,
        }
        if self.synchronous_commit is not None:
            params["options"] = f"-c synchronous_commit={self.synchronous_commit}"
        return params
