"""The servers a soak run needs besides the app: a private Redis, and where PostgreSQL schemas go.

A private ``redis-server`` (started from the main thread: it dies with the thread that started it)
carries the Celery broker, Redis stream stores and the broadcast channel, so nothing the soak does
lands in the shared Redis. PostgreSQL stream stores get a fresh schema on the shared server, dropped
afterwards; scenarios that kill PostgreSQL start their own server instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import uuid
from collections.abc import Iterator

from harness.redis_server import RedisServer
from harness.services import POSTGRES_URL

SHARED_POSTGRES = POSTGRES_URL


@dataclasses.dataclass
class Services:
    redis: RedisServer
    postgres_url: str = SHARED_POSTGRES

    @property
    def broker_url(self) -> str:
        return self.redis_db(1)

    @property
    def redis_url(self) -> str:
        return self.redis_db(0)

    def redis_db(self, number: int) -> str:
        return f"redis://127.0.0.1:{self.redis.port}/{number}"


@contextlib.contextmanager
def services(postgres_url: str = SHARED_POSTGRES) -> Iterator[Services]:
    with RedisServer(extra=["--maxclients", "10000"]) as redis:
        yield Services(redis, postgres_url)


@contextlib.contextmanager
def stream_store(kind: str, found: Services, directory: pathlib.Path) -> Iterator[str]:
    """The ``DURABLE_STREAM_URL`` of a fresh, empty store of ``kind`` (sqlite, redis or postgres)."""
    if kind == "sqlite":
        directory.mkdir(parents=True, exist_ok=True)
        yield f"sqlite:///{directory / 'streams.db'}"
    elif kind == "redis":
        yield f"{found.redis_url}?key_prefix=soak-{uuid.uuid4().hex[:8]}:"
    elif kind == "postgres":
        with postgres_schema(found.postgres_url) as url:
            yield url
    else:
        raise ValueError(f"unknown stream store {kind!r}")


@contextlib.contextmanager
def postgres_schema(base_url: str) -> Iterator[str]:
    """A schema of its own on ``base_url``'s server, dropped afterwards."""
    import sqlalchemy

    schema = f"soak_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{base_url}?schema={schema}"
    finally:
        engine = sqlalchemy.create_engine(base_url)
        try:
            with engine.begin() as connection:
                connection.execute(sqlalchemy.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        finally:
            engine.dispose()
