"""A process that cannot serve safely refuses to start: one line per problem, a non-zero exit, no traceback.

Each case starts the real entry point (gunicorn with and without the project's config, the Celery
worker, ``flask``) with the settings of the case, in ``DEPLOY_ENV=PRODUCTION`` (the default).
"""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from harness.processes import BIN, ROOT, free_port, process_env
from harness.services import POSTGRES_HOST, POSTGRES_PORT, REDIS_HOST, REDIS_PORT, redis_url

SECRET = "a-deployment-secret-of-enough-bytes-" + "s" * 8

#: What every case removes from the inherited environment (the test process's own may set some).
SETTINGS = (
    "DEPLOY_ENV",
    "SECRET_KEY",
    "SQLALCHEMY_DATABASE_URI",
    "DURABLE_STREAM_URL",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "DEMO_PAGE_ENABLED",
)


def embedded(var_dir: pathlib.Path) -> dict[str, str]:
    """The embedded stores chosen explicitly (allowed in production) and a good key."""
    return {
        "VAR_DIR": str(var_dir),
        "SQLALCHEMY_DATABASE_URI": f"sqlite:///{var_dir / 'app.db'}",
        "DURABLE_STREAM_URL": f"sqlite:///{var_dir / 'streams.db'}",
        "CELERY_BROKER_URL": "filesystem://",
        "SECRET_KEY": SECRET,
    }


def command(entry: str) -> list[str]:
    if entry == "gunicorn":  # the project's config: its master refuses before any worker starts
        return [
            str(BIN / "gunicorn"),
            "--config",
            "python:api.gunicorn_conf",
            "-k",
            "gevent",
            "-w",
            "1",
            "-b",
            f"127.0.0.1:{free_port()}",
            "api.app:app",
        ]
    if entry == "plain-gunicorn":  # `gunicorn api.app:app`: the worker refuses, and its master stops
        return [str(BIN / "gunicorn"), "-w", "1", "-b", f"127.0.0.1:{free_port()}", "api.app:app"]
    if entry == "worker":
        return [str(BIN / "celery"), "-A", "api.celery_entrypoint:celery", "worker", "--pool", "solo", "-Q", "x"]
    if entry == "flask":
        return [str(BIN / "flask"), "--app", "api.app", "reap-expired-runs"]
    raise AssertionError(entry)


def refused(entry: str, env: dict[str, str]) -> list[str]:
    """Start ``entry``; return its ``configuration error:`` lines after checking how it ended."""
    environment = process_env({})
    for name in SETTINGS:
        environment.pop(name, None)
    environment.update(env)
    result = subprocess.run(
        command(entry), cwd=ROOT, env=environment, capture_output=True, text=True, timeout=90, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("configuration error: ")]
    assert lines, output
    return [line.removeprefix("configuration error: ") for line in lines]


@pytest.mark.parametrize("entry", ["gunicorn", "worker"])
def test_the_built_in_secret_key_is_refused(tmp_path: pathlib.Path, entry: str) -> None:
    env = embedded(tmp_path)
    del env["SECRET_KEY"]
    assert refused(entry, env) == [
        "SECRET_KEY is the built-in development key, with which anyone can forge passports: set SECRET_KEY to a "
        "random value of at least 32 bytes (e.g. openssl rand -base64 42)"
    ]


@pytest.mark.parametrize("entry", ["plain-gunicorn", "worker"])
def test_a_short_secret_key_is_refused(tmp_path: pathlib.Path, entry: str) -> None:
    lines = refused(entry, embedded(tmp_path) | {"SECRET_KEY": "short-secret"})
    assert len(lines) == 1 and lines[0].startswith("SECRET_KEY is 12 bytes long: set SECRET_KEY")


def test_difys_example_secret_key_is_refused(tmp_path: pathlib.Path) -> None:
    lines = refused("worker", embedded(tmp_path) | {"SECRET_KEY": "sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U"})
    assert len(lines) == 1 and lines[0].startswith("SECRET_KEY is Dify's published example key")


@pytest.mark.parametrize("entry", ["gunicorn", "plain-gunicorn", "worker"])
def test_difys_redis_that_does_not_answer_is_refused(tmp_path: pathlib.Path, entry: str) -> None:
    port = free_port()
    env = embedded(tmp_path)
    del env["DURABLE_STREAM_URL"]  # the stream store is then Dify's Redis
    lines = refused(entry, env | {"REDIS_HOST": "127.0.0.1", "REDIS_PORT": str(port), "REDIS_PASSWORD": "pw"})
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"the Redis of Dify's REDIS_HOST, REDIS_PORT, REDIS_PASSWORD (redis://:***@127.0.0.1:{port}/0) is unreachable:"
    )


@pytest.mark.parametrize("entry", ["gunicorn", "worker", "flask"])
def test_nothing_falls_back_to_sqlite_or_the_filesystem_broker_in_production(
    tmp_path: pathlib.Path, entry: str
) -> None:
    lines = refused(entry, {"VAR_DIR": str(tmp_path), "SECRET_KEY": SECRET})
    assert lines == [
        "no app database: set SQLALCHEMY_DATABASE_URI (sqlite:///… chooses the embedded one) or Dify's DB_HOST and "
        "DB_* (DEPLOY_ENV=PRODUCTION never falls back to SQLite)",
        "no stream store: set DURABLE_STREAM_URL (sqlite:///… chooses the embedded one), REDIS_URL, or Dify's "
        "REDIS_HOST (or REDIS_USE_SENTINEL, REDIS_USE_CLUSTERS); DEPLOY_ENV=PRODUCTION never falls back to SQLite",
        "no Celery broker: set CELERY_BROKER_URL (filesystem:// chooses the embedded one); DEPLOY_ENV=PRODUCTION "
        "never falls back to it",
    ]
    assert not (tmp_path / "app.db").exists() and not (tmp_path / "streams.db").exists()


def test_our_redis_url_and_difys_parts_that_disagree_are_refused(tmp_path: pathlib.Path) -> None:
    env = embedded(tmp_path) | {"REDIS_URL": redis_url(0), "REDIS_HOST": "redis", "REDIS_PORT": str(REDIS_PORT)}
    assert refused("gunicorn", env) == [
        f"REDIS_URL (redis://{REDIS_HOST}:{REDIS_PORT}/0) and REDIS_HOST=redis disagree: unset one of them, or make "
        "both name the same Redis"
    ]


def test_our_database_uri_and_difys_parts_that_disagree_are_refused(tmp_path: pathlib.Path) -> None:
    uri = f"postgresql+psycopg://app:pw@{POSTGRES_HOST}:{POSTGRES_PORT}/test"
    env = embedded(tmp_path) | {"SQLALCHEMY_DATABASE_URI": uri, "DB_HOST": POSTGRES_HOST, "DB_PASSWORD": "another"}
    assert refused("worker", env) == [
        f"SQLALCHEMY_DATABASE_URI (postgresql+psycopg://app:***@{POSTGRES_HOST}:{POSTGRES_PORT}/test) and "
        "DB_PASSWORD=*** disagree: unset one of them, or make both name the same database"
    ]


def test_two_names_of_one_setting_that_disagree_are_refused(tmp_path: pathlib.Path) -> None:
    env = embedded(tmp_path) | {"BROADCAST_CHANNEL_TYPE": "pubsub", "EVENT_BUS_REDIS_CHANNEL_TYPE": "sharded"}
    assert refused("worker", env) == [
        "BROADCAST_CHANNEL_TYPE=pubsub and EVENT_BUS_REDIS_CHANNEL_TYPE=sharded name the same setting and disagree: "
        "set one of them"
    ]


def test_a_typo_of_our_own_setting_is_refused_with_the_setting_meant(tmp_path: pathlib.Path) -> None:
    lines = refused("worker", embedded(tmp_path) | {"SSE_PING_INTERVALL": "5", "DURABLE_STREAM_MAX_AGE": "60"})
    assert lines == [
        "unknown setting DURABLE_STREAM_MAX_AGE; did you mean DURABLE_STREAM_MAX_AGE_SECONDS?",
        "unknown setting SSE_PING_INTERVALL; did you mean SSE_PING_INTERVAL?",
    ]


def test_a_value_that_does_not_parse_is_one_line(tmp_path: pathlib.Path) -> None:
    lines = refused("gunicorn", embedded(tmp_path) | {"REDIS_PORT": "six-three-seven-nine"})
    assert lines == ["REDIS_PORT: Input should be a valid integer, unable to parse string as an integer"]


def test_a_database_that_does_not_answer_is_refused(tmp_path: pathlib.Path) -> None:
    port = free_port()
    env = embedded(tmp_path) | {"SQLALCHEMY_DATABASE_URI": f"postgresql+psycopg://app:secret@127.0.0.1:{port}/x"}
    lines = refused("worker", env)
    assert len(lines) == 1
    assert lines[0].startswith(f"the app database (postgresql+psycopg://app:***@127.0.0.1:{port}/x) is unreachable")


def test_development_starts_on_the_embedded_defaults(tmp_path: pathlib.Path) -> None:
    environment = process_env({"VAR_DIR": str(tmp_path), "DEPLOY_ENV": "DEVELOPMENT"})
    for name in SETTINGS[1:]:
        environment.pop(name, None)
    result = subprocess.run(
        command("flask"), cwd=ROOT, env=environment, capture_output=True, text=True, timeout=90, check=False
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "app.db").exists()
