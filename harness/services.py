"""Where the shared loopback services are: one place, overridable by environment variables.

Tests and benchmarks that only read and write use these shared servers (with their own key prefixes,
schemas or queues); tests that kill or restart a server start a private one instead
(:mod:`harness.redis_server`, :mod:`harness.postgres_server`) and never touch these.

=========================  ==============================================  =========================
variable                   default                                         used for
=========================  ==============================================  =========================
``TEST_REDIS_HOST``        ``127.0.0.1``                                   Redis streams, broker,
``TEST_REDIS_PORT``        ``6379``                                        broadcast channel
``TEST_POSTGRES_HOST``     ``127.0.0.1``                                   PostgreSQL streams and
``TEST_POSTGRES_PORT``     ``5432``                                        app schemas (database
``TEST_POSTGRES_USER``     ``postgres``                                    ``TEST_POSTGRES_DB``)
``TEST_POSTGRES_DB``       ``test``
=========================  ==============================================  =========================
"""

from __future__ import annotations

import os

__all__ = [
    "POSTGRES_DSN",
    "POSTGRES_HOST",
    "POSTGRES_PORT",
    "POSTGRES_URL",
    "REDIS_HOST",
    "REDIS_PORT",
    "postgres_dsn",
    "redis_url",
]

REDIS_HOST = os.environ.get("TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("TEST_REDIS_PORT", "6379"))
POSTGRES_HOST = os.environ.get("TEST_POSTGRES_HOST", "127.0.0.1")
POSTGRES_PORT = int(os.environ.get("TEST_POSTGRES_PORT", "5432"))
_POSTGRES_USER = os.environ.get("TEST_POSTGRES_USER", "postgres")
_POSTGRES_DB = os.environ.get("TEST_POSTGRES_DB", "test")


def redis_url(db: int = 0, query: str = "") -> str:
    """``redis://`` URL of the shared server's database ``db``, with an optional query string."""
    url = f"redis://{REDIS_HOST}:{REDIS_PORT}/{db}"
    return f"{url}?{query}" if query else url


def postgres_dsn(driver: str = "postgresql", query: str = "") -> str:
    """URL of the shared PostgreSQL database; ``driver`` is e.g. ``postgresql+psycopg`` for SQLAlchemy."""
    url = f"{driver}://{_POSTGRES_USER}@{POSTGRES_HOST}:{POSTGRES_PORT}/{_POSTGRES_DB}"
    return f"{url}?{query}" if query else url


POSTGRES_DSN = postgres_dsn()
POSTGRES_URL = postgres_dsn("postgresql+psycopg")
