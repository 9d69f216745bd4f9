"""The shared contract suite against the Redis adapter on a private three-master Redis Cluster.

The cluster (three ``redis-server --cluster-enabled yes`` on free loopback ports, joined with
``redis-cli --cluster create``) is started once for this module and stopped afterwards.
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing import DurableStreamContract
from harness.redis_server import RedisClusterProcess, redis_available
from tests.durable_stream import hooks

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server and redis-cli are needed")

KEY_PREFIX = f"dstest-{uuid.uuid4().hex[:12]}:"


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisClusterProcess]:
    with RedisClusterProcess() as cluster:
        yield cluster


class TestRedisClusterContract(DurableStreamContract):
    # Fewer pooled connections than the seal test's appenders: the pool is contended too.
    contended_options = {"max_connections": 2}

    @pytest.fixture(autouse=True)
    def _cluster(self, redis_cluster: RedisClusterProcess) -> None:
        self._url = redis_cluster.url

    def backend_url(self, **options: Any) -> str | None:
        query = urllib.parse.urlencode({"key_prefix": KEY_PREFIX, **options})
        return f"{self._url}?{query}"

    def make_backend(self, **options: Any) -> DurableStreamBackend:
        return connect(self._url, key_prefix=KEY_PREFIX, **options)

    def lose_last_records(self, backend: DurableStreamBackend, name: str, count: int) -> None:
        hooks.redis_lose_last_records(backend, name, count)
