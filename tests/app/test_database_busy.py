"""An overloaded or unreachable app database is a 503 with a clear code, never a 500."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from api.models.engine import db
from harness.app_database import APP_DATABASES
from harness.postgres_server import PostgresServer, postgres_available

from .conftest import AppHarness


@pytest.mark.parametrize("app_database", APP_DATABASES, indirect=True)
def test_an_exhausted_connection_pool_is_503_database_busy(make_harness: Callable[..., AppHarness]) -> None:
    pool_timeout = 1
    harness = make_harness(
        start_worker=False, SQLALCHEMY_POOL_SIZE=1, SQLALCHEMY_MAX_OVERFLOW=0, SQLALCHEMY_POOL_TIMEOUT=pool_timeout
    )
    key = harness.create_app("greeting")["api_key"]
    accepted = harness.post(
        "/v1/workflows/run", key, {"inputs": {"name": "Al"}, "user": "u1", "response_mode": "async"}
    )
    run_id = accepted.json["workflow_run_id"]
    assert harness.get(f"/v1/workflows/run/{run_id}?user=u1", key).status_code == 200
    with harness.app.app_context():
        held = db.engine.connect()  # the pool's only connection, taken as a busy request would
        try:
            started = time.monotonic()
            busy = harness.get(f"/v1/workflows/run/{run_id}?user=u1", key)
            waited = time.monotonic() - started
        finally:
            held.close()
    assert busy.status_code == 503, busy.json
    assert busy.json["code"] == "database_busy" and busy.headers["Retry-After"] == "1"
    assert pool_timeout <= waited < 5 * pool_timeout, waited  # it waited for the pool, then gave up
    # The connection is back: the same request goes through again.
    assert harness.get(f"/v1/workflows/run/{run_id}?user=u1", key).status_code == 200


@pytest.mark.skipif(not postgres_available(), reason="PostgreSQL binaries are not installed")
def test_an_unreachable_database_is_503_database_unavailable(make_harness: Callable[..., AppHarness]) -> None:
    # The app database on a private PostgreSQL server, which the test stops and starts again.
    with PostgresServer() as server:
        harness = make_harness(start_worker=False, SQLALCHEMY_DATABASE_URI=server.url)
        key = harness.create_app("greeting")["api_key"]
        body = {"inputs": {"name": "Al"}, "user": "u1", "response_mode": "async"}
        assert harness.post("/v1/workflows/run", key, body).status_code == 202
        server.stop("immediate")  # the pooled connections die with it; the pool's pre-ping finds out
        # (An id that could be a run's: the key is known to the process, the run must be looked up.)
        events = harness.get(f"/v1/workflow/{uuid.uuid4()}/events?user=u1", key)
        for answer in (harness.post("/v1/workflows/run", key, body), events):
            assert answer.status_code == 503, answer.json
            assert answer.json["code"] == "database_unavailable" and answer.headers["Retry-After"] == "5"
        server.start()
        assert harness.post("/v1/workflows/run", key, body).status_code == 202
