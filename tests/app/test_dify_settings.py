"""A Dify operator's ``.env`` works as it is: it loads unchanged, and reaches the real servers it names.

The file is ``fixtures/dify.env``: our own, with the names and layout of Dify's ``docker/.env.example``
(hundreds of settings this service has no use for included). Each test fills in the addresses of the
servers it uses and runs a workflow end to end, through a real Celery worker: Dify's Redis by parts
and PostgreSQL by ``DB_*``; Redis Sentinel (three sentinels, a primary and a replica, started here) for
the stream store, the broker and the broadcast channel, across a failover; and a Redis Cluster.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import redis
from dotenv import dotenv_values

from api.configs import AppConfig, checks
from harness.app_database import POSTGRES_ADMIN_URL
from harness.processes import running_worker
from harness.redis_sentinel import DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, RedisSentinelDeployment
from harness.redis_server import RedisClusterProcess
from harness.services import POSTGRES_HOST, POSTGRES_PORT, REDIS_HOST, REDIS_PORT, redis_url
from harness.sse import parse_sse
from harness.waiting import wait_until
from tests.app.conftest import AppHarness

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "dify.env"
SECRET = "a-dify-operators-own-secret-key-" + "k" * 16
SENTINEL_PASSWORD = "sentinel-secret"
REDIS_PASSWORD = "difyai123456"


def dify_env_file(directory: pathlib.Path, **values: str) -> pathlib.Path:
    """The fixture with ``@NAME@`` filled in from ``values`` (the others left empty, as Dify leaves them)."""
    text = FIXTURE.read_text()
    values = {"SECRET_KEY": SECRET, **values}
    for line in FIXTURE.read_text().splitlines():
        if "=@" in line:
            name = line.split("=@", 1)[1].rstrip("@")
            text = text.replace(f"@{name}@", values.get(name, ""))
    path = directory / "dify.env"
    path.write_text(text)
    return path


def env_of(path: pathlib.Path, var_dir: pathlib.Path) -> dict[str, str]:
    """The file's settings as a process environment, plus the test's own (its queue, short leases)."""
    env = {name: value for name, value in dotenv_values(path).items() if value}
    return env | {
        "VAR_DIR": str(var_dir),
        "CELERY_QUEUE": f"test-{uuid.uuid4().hex[:12]}",
        "WORKFLOW_LEASE_TTL": "3",
        "WORKFLOW_STOP_CHECK_INTERVAL": "0.05",
        "WORKFLOW_LLM_TOKEN_DELAY": "0.001",
    }


@contextlib.contextmanager
def postgres_schema() -> Iterator[dict[str, str]]:
    """Dify's ``DB_*`` for a private schema of the shared PostgreSQL (``DB_EXTRAS`` sets its search path)."""
    schema = f"dify_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield {
            "DB_HOST": POSTGRES_HOST,
            "DB_PORT": str(POSTGRES_PORT),
            "DB_USERNAME": psycopg.conninfo.conninfo_to_dict(POSTGRES_ADMIN_URL).get("user") or "postgres",
            "DB_DATABASE": str(psycopg.conninfo.conninfo_to_dict(POSTGRES_ADMIN_URL)["dbname"]),
            "DB_EXTRAS": f"options=-csearch_path%3D{schema}",
            "schema": schema,
        }
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


def run_status_in(schema: str, run_id: str) -> str | None:
    with psycopg.connect(POSTGRES_ADMIN_URL) as connection:
        row = connection.execute(f'SELECT status FROM "{schema}".workflow_runs WHERE id = %s', (run_id,)).fetchone()
    return None if row is None else str(row[0])


def streamed_run(harness: AppHarness, key: str) -> tuple[str, list[dict[str, Any]]]:
    response = harness.client.post(
        "/v1/workflows/run",
        json={"inputs": {"name": "Dify"}, "user": "u1", "response_mode": "streaming"},
        headers={"Authorization": f"Bearer {key}"},
        buffered=False,
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    events = [json.loads(m.data) for m in parse_sse(response.response) if m.data and not m.is_ping]
    response.close()
    return response.headers["X-Workflow-Run-Id"], events


def assert_succeeded(events: list[dict[str, Any]]) -> None:
    assert events[0]["event"] == "workflow_started"
    assert events[-1]["event"] == "workflow_finished" and events[-1]["data"]["status"] == "succeeded", events[-1]


@contextlib.contextmanager
def served(env: dict[str, str], log: pathlib.Path) -> Iterator[AppHarness]:
    with running_worker(env, log) as worker:
        harness = AppHarness(env, worker)
        try:
            yield harness
        finally:
            harness.close()


def test_difys_env_file_loads_as_it_is(tmp_path: pathlib.Path) -> None:
    path = dify_env_file(
        tmp_path,
        REDIS_HOST="redis",
        REDIS_PORT="6379",
        REDIS_PASSWORD=REDIS_PASSWORD,
        REDIS_DB="0",
        REDIS_USE_SENTINEL="false",
        REDIS_USE_CLUSTERS="false",
        DB_HOST="db_postgres",
        DB_PORT="5432",
        DB_USERNAME="postgres",
        DB_DATABASE="dify",
        CELERY_BROKER_URL=f"redis://:{REDIS_PASSWORD}@redis:6379/1",
        CELERY_USE_SENTINEL="false",
    )
    config = AppConfig(_env_file=path)  # type: ignore[call-arg]
    assert checks.problems(config, checks.given_names({}, path)) == []
    assert config.DEPLOY_ENV == "PRODUCTION" and config.SECRET_KEY == SECRET
    assert config.database_uri() == "postgresql+psycopg://postgres@db_postgres:5432/dify"
    assert config.durable_stream_url() == f"redis://:{REDIS_PASSWORD}@redis:6379/0"
    assert config.broker_url() == f"redis://:{REDIS_PASSWORD}@redis:6379/1"
    assert config.redis() == config.event_bus_redis() and config.BROADCAST_CHANNEL_TYPE == "pubsub"
    # Dify's meanings of the names it shares with this service.
    assert config.LOG_FORMAT == "json" and config.SQLALCHEMY_POOL_PRE_PING is False
    assert config.SQLALCHEMY_POOL_RECYCLE == 3600 and config.APP_MAX_ACTIVE_REQUESTS == 0
    assert config.REDIS_MAX_CONNECTIONS == 1000, "an empty value is unset, as Dify leaves it"


def test_a_run_reaches_difys_redis_and_postgresql(tmp_path: pathlib.Path) -> None:
    db = 7
    with postgres_schema() as database:
        schema = database.pop("schema")
        path = dify_env_file(
            tmp_path,
            REDIS_HOST=REDIS_HOST,
            REDIS_PORT=str(REDIS_PORT),
            REDIS_DB=str(db),
            REDIS_USE_SENTINEL="false",
            REDIS_USE_CLUSTERS="false",
            CELERY_BROKER_URL=redis_url(0),
            CELERY_USE_SENTINEL="false",
            **database,
        )
        with served(env_of(path, tmp_path), tmp_path / "worker.log") as harness:
            key = harness.create_app("greeting")["api_key"]
            run_id, events = streamed_run(harness, key)
            assert_succeeded(events)
            assert run_status_in(schema, run_id) == "succeeded"
            keys = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db).keys(f"*{run_id}*")
            assert keys, "the run's events are in Dify's Redis, in REDIS_DB"


def sentinel_values(sentinel: RedisSentinelDeployment) -> dict[str, str]:
    broker = ";".join(f"sentinel://:{REDIS_PASSWORD}@{node}/1" for node in sentinel.sentinel_nodes.split(","))
    return {
        # Dify's example keeps REDIS_HOST with Sentinel on: it is not used (no such host exists here).
        "REDIS_HOST": "redis",
        "REDIS_PORT": "6379",
        "REDIS_PASSWORD": REDIS_PASSWORD,
        "REDIS_DB": "0",
        "REDIS_USE_SENTINEL": "true",
        "REDIS_SENTINELS": sentinel.sentinel_nodes,
        "REDIS_SENTINEL_SERVICE_NAME": sentinel.service,
        "REDIS_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
        "REDIS_USE_CLUSTERS": "false",
        "CELERY_BROKER_URL": broker,
        "CELERY_USE_SENTINEL": "true",
        "CELERY_SENTINEL_MASTER_NAME": sentinel.service,
        "CELERY_SENTINEL_PASSWORD": SENTINEL_PASSWORD,
    }


def test_a_run_reaches_redis_through_sentinel_and_after_a_failover(tmp_path: pathlib.Path) -> None:
    with (
        RedisSentinelDeployment(password=REDIS_PASSWORD, sentinel_password=SENTINEL_PASSWORD) as sentinel,
        postgres_schema() as database,
    ):
        schema = database.pop("schema")
        path = dify_env_file(tmp_path, **sentinel_values(sentinel), **database)
        with served(env_of(path, tmp_path), tmp_path / "worker.log") as harness:
            key = harness.create_app("greeting")["api_key"]
            run_id, events = streamed_run(harness, key)
            assert_succeeded(events)
            primary = redis.Redis(port=sentinel.primary.port, password=REDIS_PASSWORD)
            assert primary.keys(f"*{run_id}*"), "the stream store is the primary the sentinels name"
            broker = redis.Redis(port=sentinel.primary.port, password=REDIS_PASSWORD, db=1)
            assert broker.keys("_kombu.binding.*"), "the broker is the primary too, in the broker URL's db"
            # Killed once the worker has acknowledged the run's task: kombu (5.7) ends a worker that loses its
            # broker while it holds an unacknowledged message (an AttributeError while it restores it), which
            # is the worker's supervisor's business, not this test's.
            wait_until(lambda: broker.hlen("unacked") == 0, 10, "the run's task to be acknowledged")
            sentinel.primary.kill()
            succeeded: list[str] = []

            def a_run_succeeds() -> bool:
                try:
                    run, after = streamed_run(harness, key)
                except AssertionError:
                    return False  # refused (503) while no primary answers
                if after[-1]["event"] == "workflow_finished" and after[-1]["data"]["status"] == "succeeded":
                    succeeded.append(run)
                    return True
                return False

            # The sentinels call the primary down after DOWN_AFTER_MS, then promote the replica; the API,
            # the worker and the broker each ask them again as their connections fail.
            budget = (DOWN_AFTER_MS + FAILOVER_TIMEOUT_MS) / 1000 + 60
            wait_until(a_run_succeeds, budget, "a run to succeed after the failover", interval=0.5)
            assert sentinel.master_port() == sentinel.replica.port
            replica = redis.Redis(port=sentinel.replica.port, password=REDIS_PASSWORD)
            assert replica.keys(f"*{succeeded[0]}*"), "after the failover the store is the promoted replica"
            assert run_status_in(schema, succeeded[0]) == "succeeded"


def test_the_broadcast_channel_reaches_redis_through_sentinel(tmp_path: pathlib.Path) -> None:
    with (
        RedisSentinelDeployment(password=REDIS_PASSWORD, sentinel_password=SENTINEL_PASSWORD) as sentinel,
        postgres_schema() as database,
    ):
        database.pop("schema")
        path = dify_env_file(tmp_path, **sentinel_values(sentinel), **database)
        env = env_of(path, tmp_path) | {"WORKFLOW_EVENT_TRANSPORT": "broadcast_channel"}
        with served(env, tmp_path / "worker.log") as harness:
            key = harness.create_app("greeting")["api_key"]
            _, events = streamed_run(harness, key)
            assert_succeeded(events)
            stats = redis.Redis(port=sentinel.primary.port, password=REDIS_PASSWORD).info("commandstats")
            assert stats["cmdstat_publish"]["calls"] >= len(events), "the events went through the primary"


def test_a_run_reaches_a_redis_cluster(tmp_path: pathlib.Path) -> None:
    with RedisClusterProcess() as cluster, postgres_schema() as database:
        database.pop("schema")
        path = dify_env_file(
            tmp_path,
            REDIS_HOST="redis",
            REDIS_USE_SENTINEL="false",
            REDIS_USE_CLUSTERS="true",
            REDIS_CLUSTERS=",".join(server.address for server in cluster.servers),
            CELERY_BROKER_URL=redis_url(0),
            CELERY_USE_SENTINEL="false",
            **database,
        )
        with served(env_of(path, tmp_path), tmp_path / "worker.log") as harness:
            key = harness.create_app("greeting")["api_key"]
            run_id, events = streamed_run(harness, key)
            assert_succeeded(events)
            stored = [redis.Redis(port=server.port).keys(f"*{run_id}*") for server in cluster.servers]
            assert sum(len(keys) for keys in stored) >= 2, "the run's stream and metadata live in the cluster"
            assert sum(1 for keys in stored if keys) == 1, "in one slot, on one node"
        # The broadcast channel (Dify's event bus) on the same cluster, with Dify's default pubsub type.
        env = env_of(path, tmp_path) | {"WORKFLOW_EVENT_TRANSPORT": "broadcast_channel"}
        with served(env, tmp_path / "broadcast-worker.log") as harness:
            key = harness.create_app("greeting")["api_key"]
            _, events = streamed_run(harness, key)
            assert_succeeded(events)


def test_no_dify_setting_is_taken_for_a_typo_of_ours(tmp_path: pathlib.Path) -> None:
    """None of Dify's names starts with one of this service's own prefixes: none is refused as unknown."""
    path = dify_env_file(tmp_path, DB_HOST="db", CELERY_BROKER_URL="filesystem://")
    names = set(dotenv_values(path))
    assert len(names) > 100
    assert checks.unknown_setting_problems(names) == []
