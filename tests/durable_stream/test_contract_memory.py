"""The shared contract suite against the in-process reference adapter."""

from __future__ import annotations

from typing import Any

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing import DurableStreamContract
from tests.durable_stream import hooks


class TestMemoryContract(DurableStreamContract):
    store_in_process = True

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return connect("memory://", **options)

    def lose_last_records(self, backend: DurableStreamBackend, name: str, count: int) -> None:
        hooks.memory_lose_last_records(backend, name, count)
