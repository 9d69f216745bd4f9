"""The shared contract suite against the Redis adapter on the shared server (127.0.0.1:6379, db 0).

Every run uses its own ``key_prefix`` and every test its own topic names, so runs never collide.
"""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Any

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing import DurableStreamContract
from harness.services import redis_url
from tests.durable_stream import hooks

REDIS_URL = redis_url(0)
KEY_PREFIX = f"dstest-{uuid.uuid4().hex[:12]}:"


class TestRedisContract(DurableStreamContract):
    # Fewer pooled connections than the seal test's appenders: the pool is contended too.
    contended_options = {"max_connections": 2}

    def backend_url(self, **options: Any) -> str | None:
        query = urllib.parse.urlencode({"key_prefix": KEY_PREFIX, **options})
        return f"{REDIS_URL}?{query}"

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return connect(REDIS_URL, key_prefix=KEY_PREFIX, **options)

    def lose_last_records(self, backend: DurableStreamBackend, name: str, count: int) -> None:
        hooks.redis_lose_last_records(backend, name, count)
