"""The shared contract suite against the in-process reference adapter."""

from __future__ import annotations

from typing import Any

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing import DurableStreamContract


class TestMemoryContract(DurableStreamContract):
    store_in_process = True

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return connect("memory://", **options)
