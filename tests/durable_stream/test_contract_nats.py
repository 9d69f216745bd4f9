"""The shared contract suite against the NATS JetStream adapter, on a private current ``nats-server``.

One server (JetStream, file storage in a temporary directory, a free loopback port) serves the whole
module and is stopped afterwards; the shared 2.9 server on 127.0.0.1:4222 is too old and never
used. Stream limits (``max_records``, ``max_age_seconds``) are stream settings, so each set of
retention options gets its own stream.
"""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing import DurableStreamContract
from harness.nats_server import NatsServer
from tests.durable_stream import hooks

_STREAM_OPTIONS = ("max_records", "max_age_seconds", "replicas", "storage")


@pytest.fixture(scope="module")
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


def stream_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with a ``stream`` (and its own subjects) named after its stream-level settings."""
    limits = sorted((name, str(options[name])) for name in _STREAM_OPTIONS if name in options)
    suffix = hashlib.blake2b(repr(limits).encode(), digest_size=4).hexdigest() if limits else "default"
    return {"stream": f"DSTEST_{suffix}", "subject_prefix": f"dstest.{suffix}", **options}


class TestNatsContract(DurableStreamContract):
    @pytest.fixture(autouse=True)
    def _server(self, nats_server: NatsServer) -> None:
        self._url = nats_server.url

    def backend_url(self, **options: Any) -> str | None:
        return f"{self._url}?{urllib.parse.urlencode(stream_options(options))}"

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return connect(self._url, **stream_options(options))

    def lose_last_records(self, backend: DurableStreamBackend, name: str, count: int) -> None:
        hooks.nats_lose_last_records(backend, name, count)
