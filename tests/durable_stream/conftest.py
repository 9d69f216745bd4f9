"""Fixtures shared by the durable-stream adapter tests.

``open_backend`` opens backends on the module's ``SHARED_URL`` with the module's
``backend_defaults`` (a fixture a module overrides: a private key prefix, a private schema) and
closes every one of them after the test. ``server`` is a private Redis server for tests that stop,
kill or reconfigure one (the PostgreSQL fault tests override it with their own server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from api.core.durable_stream import DurableStreamBackend, connect
from api.core.durable_stream.testing.helpers import closing_all
from harness.redis_server import RedisServer

#: Contract tests that are soak-like on a store of its own: 20,000 records of 1 KB appended by another
#: process while a reader waits, to measure that reader's memory (a minute on NATS, half of one on a Redis
#: Cluster, per adapter and per run). ``make bench`` runs them (``pytest -m soak``); ``make test`` does not.
SOAK = frozenset({"test_records_piling_up_for_an_idle_subscriber_do_not_grow_its_memory"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if getattr(item, "originalname", item.name) in SOAK:
            item.add_marker(pytest.mark.soak)


@pytest.fixture
def backend_defaults() -> dict[str, Any]:
    """Options every backend of the module is opened with unless a test says otherwise."""
    return {}


@pytest.fixture
def open_backend(
    request: pytest.FixtureRequest, backend_defaults: dict[str, Any]
) -> Iterator[Callable[..., DurableStreamBackend]]:
    """``open_backend(url=SHARED_URL, **options)``; every backend it opened is closed after the test."""
    shared_url: str = request.module.SHARED_URL

    def open_(url: str = shared_url, **options: Any) -> DurableStreamBackend:
        return connect(url, **{**backend_defaults, **options})

    with closing_all(open_) as opener:
        yield opener


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private ``redis-server`` of this test alone."""
    with RedisServer() as private:
        yield private
