"""``/health/live`` and ``/health/ready`` with every dependency up, and with each one stopped in turn."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from harness.postgres_server import PostgresServer, postgres_available
from harness.redis_server import RedisServer
from tests.app.conftest import AppHarness

pytestmark = pytest.mark.timeout(120)


def ready(harness: AppHarness) -> tuple[int, dict[str, object], float]:
    began = time.monotonic()
    response = harness.client.get("/health/ready")
    return response.status_code, response.json, time.monotonic() - began


def test_live_and_ready_with_everything_up(harness: AppHarness) -> None:
    live = harness.client.get("/health/live")
    assert live.status_code == 200 and live.json == {"status": "ok"}
    status, body, _ = ready(harness)
    assert status == 200 and body["checks"] == {"database": "ok", "stream_store": "ok", "broker": "ok"}


def test_ready_names_a_stopped_stream_store(make_harness: Callable[..., AppHarness]) -> None:
    with RedisServer() as store:
        harness = make_harness(start_worker=False, DURABLE_STREAM_URL=f"{store.url}?key_prefix=health:")
        assert ready(harness)[0] == 200
        store.kill()
        status, body, took = ready(harness)
    assert status == 503 and body["code"] == "not_ready" and took < 5
    assert body["checks"] == {"database": "ok", "stream_store": "unavailable", "broker": "ok"}
    assert "stream_store" in str(body["message"])


def test_ready_names_a_stopped_broker(make_harness: Callable[..., AppHarness]) -> None:
    with RedisServer() as broker:
        harness = make_harness(start_worker=False, CELERY_BROKER_URL=broker.url)
        assert ready(harness)[0] == 200
        broker.kill()
        status, body, took = ready(harness)
    assert status == 503 and body["checks"]["broker"] in ("unavailable", "timeout") and took < 5
    assert body["checks"]["database"] == "ok" and body["checks"]["stream_store"] == "ok"


@pytest.mark.skipif(not postgres_available(), reason="PostgreSQL binaries are not installed")
def test_ready_names_a_stopped_database(make_harness: Callable[..., AppHarness]) -> None:
    with PostgresServer() as database:
        harness = make_harness(
            start_worker=False, SQLALCHEMY_DATABASE_URI=database.url.replace("postgresql:", "postgresql+psycopg:")
        )
        assert ready(harness)[0] == 200
        database.stop()
        status, body, took = ready(harness)
    assert status == 503 and body["checks"]["database"] in ("unavailable", "timeout") and took < 5
    assert (
        body["checks"]["stream_store"] == "ok" and int(harness.client.get("/health/ready").headers["Retry-After"]) > 0
    )
