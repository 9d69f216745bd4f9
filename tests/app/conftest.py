"""Fixtures for the app tests: real Celery workers on a Redis broker, SQLite or PostgreSQL data.

The app database is SQLite unless a module parametrizes ``app_database``, e.g. with
``pytestmark = pytest.mark.parametrize("app_database", APP_DATABASES, indirect=True, scope="module")``;
then its ``harness`` and ``make_harness`` run once on each database (PostgreSQL in a private schema).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from api.app_factory import create_app
from api.configs import AppConfig
from api.core.app.apps.event_codec import stamp_of, unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.extensions.ext_durable_stream import durable_stream
from api.models.engine import db
from harness.app_database import app_database_uri
from harness.app_env import base_env
from harness.processes import Worker, running_worker
from tests.app import examples


class AppHarness:
    """The API in-process (Flask test client) plus a real worker process, sharing one environment."""

    def __init__(self, env: dict[str, str], worker: Worker | None) -> None:
        self.env = env
        self.worker = worker
        self.app: Flask = create_app(AppConfig(**env))  # type: ignore[arg-type]
        self.client: FlaskClient = self.app.test_client()

    def create_app(self, definition: dict[str, Any] | str = "greeting") -> dict[str, str]:
        if isinstance(definition, str):
            definition = examples.example(definition)
        path = pathlib.Path(self.env["VAR_DIR"]) / f"app-{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(definition))
        result = self.app.test_cli_runner().invoke(args=["create-app", "--file", str(path)])
        assert result.exit_code == 0, result.output
        created: dict[str, str] = json.loads(result.output)
        return created

    def post(self, path: str, key: str, body: Any) -> Any:
        return self.client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})

    def get(self, path: str, key: str) -> Any:
        return self.client.get(path, headers={"Authorization": f"Bearer {key}"})

    def events(self, run_id: str, mode: str = "workflow") -> list[dict[str, Any]]:
        """Every retained event of a run, read from its topic (without waiting)."""
        return [event for _, event in self.records(run_id, mode)]

    def records(self, run_id: str, mode: str = "workflow") -> list[tuple[float, dict[str, Any]]]:
        """Every retained event of a run with the time its writer appended it (its record's stamp)."""
        with self.app.app_context():
            topic = durable_stream().topic(workflow_run_topic(mode, run_id))
            events = []
            with topic.subscribe_from_beginning() as subscription:
                while True:
                    record = subscription.receive(timeout=0)
                    if record is None or not hasattr(record, "payload"):
                        break
                    events.append((stamp_of(record.payload) or 0.0, json.loads(unstamped(record.payload))))
            return events

    def topic_info(self, run_id: str, mode: str = "workflow") -> Any:
        with self.app.app_context():
            return durable_stream().admin.topic_info(workflow_run_topic(mode, run_id))

    def sealed(self, run_id: str, mode: str = "workflow") -> Any:
        """The run's topic info once its topic is sealed, else ``None`` (for ``wait_until``)."""
        info = self.topic_info(run_id, mode)
        return info if info is not None and info.sealed else None

    def close(self) -> None:
        with self.app.app_context():
            self.app.extensions["durable_stream"].close()
            # Pooled connections would hold a private PostgreSQL schema open while it is dropped.
            db.engine.dispose()


@pytest.fixture(scope="module")
def app_database(request: pytest.FixtureRequest) -> str:
    kind: str = getattr(request, "param", "sqlite")
    return kind


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory, app_database: str) -> Iterator[dict[str, str]]:
    var_dir = tmp_path_factory.mktemp("app")
    with app_database_uri(app_database, var_dir) as uri:
        yield base_env(var_dir, SQLALCHEMY_DATABASE_URI=uri)


@pytest.fixture(scope="module")
def harness(module_env: dict[str, str]) -> Iterator[AppHarness]:
    log = pathlib.Path(module_env["VAR_DIR"]) / "worker.log"
    with running_worker(module_env, log) as worker:
        harness = AppHarness(module_env, worker)
        yield harness
        harness.close()


@pytest.fixture
def make_harness(tmp_path: pathlib.Path, app_database: str) -> Iterator[Callable[..., AppHarness]]:
    """A harness with its own environment, database and worker, for tests that change settings or kill workers."""
    with contextlib.ExitStack() as stack:

        def make(start_worker: bool = True, **overrides: Any) -> AppHarness:
            var_dir = tmp_path / uuid.uuid4().hex[:8]
            var_dir.mkdir(parents=True)
            uri = stack.enter_context(app_database_uri(app_database, var_dir))
            env = base_env(var_dir, **{"SQLALCHEMY_DATABASE_URI": uri, **overrides})
            worker = stack.enter_context(running_worker(env, var_dir / "worker.log")) if start_worker else None
            harness = AppHarness(env, worker)
            stack.callback(harness.close)
            return harness

        yield make
