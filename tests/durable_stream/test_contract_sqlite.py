"""The shared contract suite against the SQLite adapter (one database file per test)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing import DurableStreamContract
from tests.durable_stream import hooks


class TestSqliteContract(DurableStreamContract):
    # 100k single-record transactions: fsync on each (the durable default) would take minutes.
    bulk_append_options = {"synchronous": "normal"}

    @pytest.fixture(autouse=True)
    def _database(self, tmp_path: pathlib.Path) -> None:
        self._url = f"sqlite:///{tmp_path / 'streams.db'}"

    def backend_url(self, **options: Any) -> str | None:
        query = "&".join(f"{name}={value}" for name, value in options.items())
        return f"{self._url}?{query}" if query else self._url

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return connect(self._url, **options)

    def lose_last_records(self, backend: DurableStreamBackend, name: str, count: int) -> None:
        hooks.sqlite_lose_last_records(backend, name, count)
