"""App databases for tests and benchmarks: a SQLite file, or a private schema in PostgreSQL's ``test`` database."""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from collections.abc import Iterator

import psycopg

from harness.services import POSTGRES_DSN, postgres_dsn

__all__ = ["APP_DATABASES", "POSTGRES_ADMIN_URL", "app_database_uri", "private_postgres_schema"]

APP_DATABASES = ("sqlite", "postgresql")
POSTGRES_ADMIN_URL = POSTGRES_DSN


@contextlib.contextmanager
def private_postgres_schema() -> Iterator[str]:
    """An app database URI whose tables live in a new schema, dropped afterwards."""
    schema = f"app_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield postgres_dsn("postgresql+psycopg", f"options=-csearch_path%3D{schema}")
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextlib.contextmanager
def app_database_uri(kind: str, var_dir: pathlib.Path) -> Iterator[str]:
    """``SQLALCHEMY_DATABASE_URI`` for ``kind`` (one of :data:`APP_DATABASES`)."""
    if kind == "sqlite":
        yield f"sqlite:///{var_dir / 'app.db'}"
    elif kind == "postgresql":
        with private_postgres_schema() as uri:
            yield uri
    else:
        raise ValueError(f"unknown app database {kind!r}; expected one of {APP_DATABASES}")
