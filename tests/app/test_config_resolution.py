"""What Dify's settings and ours resolve to, how they must agree, and ``flask config check``."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest

from api.configs import AppConfig, ConfigurationError, checks, resolve
from api.configs.redis_target import RedisTarget, mask_url
from harness.processes import BIN, ROOT, process_env

SECRET = "a-deployment-secret-of-enough-bytes-" + "s" * 8


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AppConfig.model_fields:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(pathlib.Path(__file__).parent)  # no .env file here


def config(**values: Any) -> AppConfig:
    return AppConfig(SECRET_KEY=SECRET, **values)


def test_sentinel_parts_are_the_stream_stores_sentinel_url() -> None:
    settings = config(
        REDIS_USE_SENTINEL=True,
        REDIS_SENTINELS="10.0.0.1:26379, 10.0.0.2:26379,",
        REDIS_SENTINEL_SERVICE_NAME="mymaster",
        REDIS_SENTINEL_PASSWORD="s p",
        REDIS_PASSWORD="pw",
        REDIS_DB=2,
        REDIS_HOST="ignored-with-sentinel",
    )
    assert settings.durable_stream_url() == (
        "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/2?sentinel_password=s+p&sentinel_socket_timeout=0.1"
    )
    target = settings.redis()
    assert (
        target is not None
        and target.mode == "sentinel"
        and target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379))
    )
    assert resolve.stream_store(settings).source == (
        "the app's Redis (Dify's REDIS_HOST, REDIS_PASSWORD, REDIS_DB, REDIS_USE_SENTINEL, REDIS_SENTINELS, "
        "REDIS_SENTINEL_SERVICE_NAME)"
    )


def test_cluster_parts_use_the_cluster_password_first() -> None:
    settings = config(
        REDIS_USE_CLUSTERS=True, REDIS_CLUSTERS="n1:7000,n2:7001", REDIS_PASSWORD="a", REDIS_CLUSTERS_PASSWORD="b"
    )
    assert settings.durable_stream_url() == "redis+cluster://:b@n1:7000,n2:7001"


def test_tls_parts_carry_difys_certificate_options() -> None:
    settings = config(
        REDIS_HOST="r", REDIS_USE_SSL=True, REDIS_SSL_CERT_REQS="CERT_REQUIRED", REDIS_SSL_CA_CERTS="/ca.pem"
    )
    assert settings.durable_stream_url() == "rediss://r:6379/0?ssl_cert_reqs=required&ssl_ca_certs=%2Fca.pem"


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"REDIS_USE_SENTINEL": True, "REDIS_USE_CLUSTERS": True, "REDIS_SENTINELS": "a:1", "REDIS_CLUSTERS": "b:2"},
            "REDIS_USE_SENTINEL and REDIS_USE_CLUSTERS are both true: choose one",
        ),
        (
            {"REDIS_USE_SENTINEL": True, "REDIS_SENTINELS": "a:1"},
            "REDIS_USE_SENTINEL is true but REDIS_SENTINEL_SERVICE_NAME is empty",
        ),
        ({"REDIS_USE_SENTINEL": True}, "REDIS_USE_SENTINEL is true but REDIS_SENTINELS is empty"),
        ({"REDIS_USE_CLUSTERS": True, "REDIS_CLUSTERS": "x:1,pass@host"}, "REDIS_CLUSTERS: entry 2 is not host:port"),
        ({"DB_TYPE": "mysql"}, "DB_TYPE=mysql: this service stores its data in PostgreSQL only"),
        (
            {"REDIS_USE_SSL": True, "REDIS_USE_CLUSTERS": True, "REDIS_CLUSTERS": "n:1", "DURABLE_STREAM_URL": ""},
            "the stream store does not reach a Redis Cluster over TLS",
        ),
        (
            {"CELERY_USE_SENTINEL": True, "CELERY_BROKER_URL": "redis://r/1"},
            "CELERY_USE_SENTINEL is true but CELERY_BROKER_URL (redis://r/1)",
        ),
        (
            {"CELERY_BROKER_URL": "sentinel://s:26379/1"},
            "CELERY_BROKER_URL lists sentinels (sentinel://…) but CELERY_USE_SENTINEL is not true",
        ),
        ({"REDIS_URL": "redis://r:6379/0", "REDIS_DB": 3}, "REDIS_URL (redis://r:6379/0) and REDIS_DB=3 disagree"),
        (
            {
                "WORKFLOW_EVENT_TRANSPORT": "broadcast_channel",
                "EVENT_BUS_REDIS_URL": "redis://n1:7000,n2:7001",
                "EVENT_BUS_REDIS_USE_CLUSTERS": True,
                "EVENT_BUS_REDIS_CHANNEL_TYPE": "sharded",
            },
            "EVENT_BUS_REDIS_CHANNEL_TYPE=sharded on a Redis Cluster (EVENT_BUS_REDIS_URL) is not served",
        ),
        (
            {"REDIS_URL": "redis://:x@r:6379/0", "REDIS_PASSWORD": "y"},
            "REDIS_URL (redis://:***@r:6379/0) and REDIS_PASSWORD=*** disagree",
        ),
        (
            {
                "REDIS_URL": "redis://r:6379/0",
                "REDIS_USE_SENTINEL": True,
                "REDIS_SENTINELS": "s:1",
                "REDIS_SENTINEL_SERVICE_NAME": "m",
            },
            "REDIS_URL (redis://r:6379/0) and REDIS_USE_SENTINEL=true disagree",
        ),
        (
            {"SQLALCHEMY_DATABASE_URI": "postgresql+psycopg://u@h:5432/d", "DB_DATABASE": "dify"},
            "SQLALCHEMY_DATABASE_URI (postgresql+psycopg://u@h:5432/d) and DB_DATABASE=dify disagree",
        ),
    ],
)
def test_settings_that_cannot_serve_are_named(values: dict[str, Any], problem: str) -> None:
    chosen = {
        "DURABLE_STREAM_URL": "memory://",
        "SQLALCHEMY_DATABASE_URI": "sqlite://",
        "CELERY_BROKER_URL": "filesystem://",
    }
    found = checks.problems(config(**(chosen | values)))
    assert any(line.startswith(problem) for line in found), found


def test_our_url_and_difys_parts_that_agree_are_one_redis() -> None:
    settings = config(
        REDIS_URL="redis://:pw@r:6380/2", REDIS_HOST="r", REDIS_PORT=6380, REDIS_PASSWORD="pw", REDIS_DB=2
    )
    assert resolve.main_redis(settings) == (
        RedisTarget("standalone", host="r", port=6380, db=2, password="pw"),
        "REDIS_URL",
    )
    assert settings.durable_stream_url() == "redis://:pw@r:6380/2"


def test_the_event_bus_is_its_own_redis_or_the_apps() -> None:
    settings = config(REDIS_HOST="main", PUBSUB_REDIS_URL="redis://:pw@n1:7000,n2:7001", PUBSUB_REDIS_USE_CLUSTERS=True)
    bus = settings.event_bus_redis()
    assert bus is not None and bus.mode == "cluster" and bus.nodes == (("n1", 7000), ("n2", 7001))
    assert config(REDIS_HOST="main").event_bus_redis() == config(REDIS_HOST="main").redis()
    assert AppConfig(SECRET_KEY=SECRET, EVENT_BUS_REDIS_CHANNEL_TYPE="sharded").BROADCAST_CHANNEL_TYPE == "sharded"


def test_database_parts_are_a_postgresql_url_with_difys_extras() -> None:
    settings = config(DB_HOST="db", DB_PASSWORD="p@ss", DB_EXTRAS="keepalives_idle=60&keepalives=1", DB_CHARSET="utf8")
    assert settings.database_uri() == (
        "postgresql+psycopg://postgres:p%40ss@db:5432/dify?client_encoding=utf8&keepalives=1&keepalives_idle=60"
    )


def test_development_falls_back_to_the_embedded_stores(tmp_path: pathlib.Path) -> None:
    settings = AppConfig(DEPLOY_ENV="development", VAR_DIR=tmp_path)
    assert settings.DEPLOY_ENV == "DEVELOPMENT" and checks.problems(settings) == []
    assert settings.database_uri() == f"sqlite:///{tmp_path / 'app.db'}"
    assert settings.durable_stream_url() == f"sqlite:///{tmp_path / 'streams.db'}"
    assert settings.broker_url() == "filesystem://" and settings.demo_page_enabled()
    with pytest.raises(ConfigurationError, match="no app database"):
        AppConfig(VAR_DIR=tmp_path).database_uri()


def test_celery_sentinel_options_are_difys() -> None:
    settings = config(
        CELERY_USE_SENTINEL=True,
        CELERY_BROKER_URL="sentinel://:pw@s1:26379/1;sentinel://:pw@s2:26379/1",
        CELERY_SENTINEL_MASTER_NAME="mymaster",
        CELERY_SENTINEL_PASSWORD="sp",
        CELERY_SENTINEL_SOCKET_TIMEOUT=0.5,
    )
    assert settings.broker_transport_options() == {
        "master_name": "mymaster",
        "sentinel_kwargs": {"socket_timeout": 0.5, "password": "sp"},
    }


def test_urls_are_masked() -> None:
    assert mask_url("redis+sentinel://u:pw@a:1,b:2/m/0?sentinel_password=x&sentinel_socket_timeout=0.1") == (
        "redis+sentinel://u:***@a:1,b:2/m/0?sentinel_password=***&sentinel_socket_timeout=0.1"
    )
    assert mask_url("sqlite:////var/app.db") == "sqlite:////var/app.db"


def run_check(env: dict[str, str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    environment = process_env(env)
    for name in AppConfig.model_fields:
        if name not in env:
            environment.pop(name, None)
    environment["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [str(BIN / "flask"), "--app", "api.app", "config", "check"],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_config_check_prints_the_resolution_masked_with_sources(tmp_path: pathlib.Path) -> None:
    (tmp_path / ".env").write_text("DB_PASSWORD=secret-db-password\nEVENT_BUS_REDIS_CHANNEL_TYPE=sharded\n")
    result = run_check(
        {
            "SECRET_KEY": SECRET,
            "DB_HOST": "db.internal",
            "REDIS_HOST": "redis.internal",
            "REDIS_PASSWORD": "secret-redis-password",
            "CELERY_BROKER_URL": "redis://:secret-broker@redis.internal:6379/1",
            "VAR_DIR": str(tmp_path),
        },
        tmp_path,
    )
    out = result.stdout
    assert "secret" not in out.replace("secret_key", "").replace("SECRET_KEY", ""), out
    assert (
        "  app database     postgresql+psycopg://postgres:***@db.internal:5432/dify    [Dify's DB_HOST, DB_PASSWORD]"
        in out
    )
    assert (
        "  stream store     redis://:***@redis.internal:6379/0    [the app's Redis (Dify's REDIS_HOST, REDIS_PASSWORD)]"
        in out
    )
    assert "  DB_PASSWORD=***    [.env]" in out
    assert "  BROADCAST_CHANNEL_TYPE=sharded    [.env, as EVENT_BUS_REDIS_CHANNEL_TYPE]" in out
    assert "  REDIS_HOST=redis.internal    [environment]" in out and "  REDIS_DB=0    [default]" in out
    # Neither host exists: the check reads the settings, it does not connect (the service's start does).
    assert "problems: none" in out and result.returncode == 0, out + result.stderr


def test_config_check_lists_the_problems_the_service_would_refuse(tmp_path: pathlib.Path) -> None:
    result = run_check({"SECRET_KEY": "short", "VAR_DIR": str(tmp_path), "SSE_PING_INTERVALL": "3"}, tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert "  app database     (refused: no app database: set SQLALCHEMY_DATABASE_URI" in result.stdout
    assert "  unknown setting SSE_PING_INTERVALL; did you mean SSE_PING_INTERVAL?" in result.stdout
    assert "  SECRET_KEY is 5 bytes long: set SECRET_KEY to a random value of at least 32 bytes" in result.stdout
    assert "SECRET_KEY=***" in result.stdout
