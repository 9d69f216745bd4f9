"""The shared contract suite against the PostgreSQL adapter on the shared server.

All tests of a session share one schema, unique to the session and dropped at its end, so runs
never collide with each other or with the application's own tables. Topic names are unique per test.
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing import DurableStreamContract
from harness.services import POSTGRES_URL
from tests.durable_stream import hooks

SHARED_URL = POSTGRES_URL


@pytest.fixture(scope="session")
def postgres_contract_schema() -> Iterator[str]:
    import sqlalchemy

    schema = f"ds_contract_{uuid.uuid4().hex[:12]}"
    yield schema
    engine = sqlalchemy.create_engine(SHARED_URL)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        engine.dispose()


class TestPostgresContract(DurableStreamContract):
    # Fewer pooled connections than the seal test's appenders: the pool is contended too.
    contended_options = {"pool_size": 2}

    # The 100k-record bulk append runs in a child process; per-commit WAL flushes on the shared
    # server would dominate the test's run time, and durability is not what that test checks.
    bulk_append_options = {"synchronous_commit": "off"}

    @pytest.fixture(autouse=True)
    def _schema(self, postgres_contract_schema: str) -> None:
        self._schema_name = postgres_contract_schema

    def backend_url(self, **options: Any) -> str | None:
        query = urllib.parse.urlencode({"schema": self._schema_name, **options})
        return f"{SHARED_URL}?{query}"

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return connect(SHARED_URL, schema=self._schema_name, **options)

    def lose_last_records(self, backend: DurableStreamBackend, name: str, count: int) -> None:
        hooks.postgres_lose_last_records(backend, name, count)
