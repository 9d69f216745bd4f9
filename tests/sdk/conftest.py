"""The Python client and the CLI against the app as deployed: real ``gunicorn -k gevent`` and Celery.

One stack serves every test of this package (starting one takes seconds): two gunicorn masters with
one gevent worker each (so a killed worker's client can resume on the other, as behind a load
balancer), one Celery worker, and a private Redis as the durable stream store (so a test can take
the store away and bring it back without touching the shared server). Clients reach the servers
through a :class:`~harness.tcp_relay.TcpRelay` the test controls.

The app is imported only where the stack is used, so the tests that need no server (the client's
parsing and decisions, against crafted answers) run whatever state the app is in.
"""

from __future__ import annotations

import copy
import json
import pathlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from durable_workflow_client import RetryPolicy
from sqlalchemy import func, select

from harness.app_env import base_env
from harness.redis_server import RedisServer
from harness.served_stack import ServedStack
from harness.tcp_relay import TcpRelay
from tests.app import examples

GREETING = examples.greeting()
#: Reconnects come quickly in tests (the budget still counts them).
FAST_RETRY = RetryPolicy(initial_delay=0.01, max_delay=0.5, max_attempts=20)


def slow_greeting(delay: float, tokens: int) -> dict[str, Any]:
    """The greeting app whose LLM node streams ``tokens`` words, ``delay`` seconds apart."""
    definition: dict[str, Any] = copy.deepcopy(GREETING)
    definition["name"] = f"Greeting of {tokens} words"
    definition = examples.script_model(definition, response=" ".join(f"word{i}" for i in range(tokens)))
    definition = examples.script_model(definition, token_delay=delay)
    return definition


def failing_greeting() -> dict[str, Any]:
    """The greeting app whose model fails after three words."""
    definition = slow_greeting(0.001, 20)
    definition["name"] = "Failing greeting"
    definition = examples.script_model(definition, error_after_tokens=3, error="the model failed on purpose")
    return definition


class Sdk:
    """The stack, its apps, and what the tests check against: the events as stored and the run rows."""

    def __init__(self, stack: ServedStack, store: RedisServer) -> None:
        self.stack = stack
        self.store = store
        #: API keys by app: ``greeting`` (pauses with mood "formal"), ``slow`` (~0.6 s of text), ``long`` (~3 s),
        #: ``failing`` (its model fails).
        self.keys = {
            "greeting": stack.create_app(GREETING),
            "slow": stack.create_app(slow_greeting(0.004, 150)),
            "long": stack.create_app(slow_greeting(0.01, 300)),
            "failing": stack.create_app(failing_greeting()),
        }
        from api.models import App
        from api.models.engine import db

        with stack.app.app_context():
            codes = {app.api_key: app.site_code for app in db.session.execute(select(App)).scalars()}
            db.session.remove()
        #: The web app's site code of each app, by the same names.
        self.site_codes = {name: codes[key] for name, key in self.keys.items()}

    @property
    def upstreams(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", server.port) for server in self.stack.servers]

    def relay(self, cut_after: Callable[[], int | None] = lambda: None, seed: int = 0) -> TcpRelay:
        return TcpRelay(self.upstreams, cut_after=cut_after, rng=random.Random(seed))

    def stored_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events as its topic holds them, once the topic is sealed (the run is over)."""
        from api.core.app.apps.event_codec import unstamped
        from api.core.app.apps.topics import workflow_run_topic
        from api.core.durable_stream import CLOSED
        from api.extensions.ext_durable_stream import durable_stream

        with self.stack.app.app_context():
            topic = durable_stream().topic(workflow_run_topic("workflow", run_id))
            events = []
            with topic.subscribe_from_beginning() as subscription:
                while (record := subscription.receive(timeout=10)) is not CLOSED:
                    assert record is not None, f"the topic of run {run_id} was not sealed in time"
                    events.append(json.loads(unstamped(record.payload)))
            return events

    def trim(self, run_id: str, keep_last: int) -> None:
        """Retention passes the run: only its last ``keep_last`` events stay."""
        from api.core.app.apps.topics import workflow_run_topic
        from api.extensions.ext_durable_stream import durable_stream

        with self.stack.app.app_context():
            durable_stream().admin.trim_topic(workflow_run_topic("workflow", run_id), keep_last=keep_last)

    def run_row(self, run_id: str) -> dict[str, Any]:
        row = self.stack.run_row(run_id)
        assert row is not None
        return row

    def runs_with_input(self, user: str, marker: str) -> int:
        """How many runs of ``user`` the app database holds whose inputs contain ``marker`` (a value
        unique to one test): what a start sent twice must not have made more than one of."""
        from api.models import WorkflowRun
        from api.models.engine import db

        query = select(func.count()).where(WorkflowRun.end_user == user, WorkflowRun.inputs_json.contains(marker))
        with self.stack.app.app_context():
            try:
                count: int = db.session.execute(query).scalar_one()
                return count
            finally:
                db.session.remove()


@pytest.fixture(scope="package")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sdk]:
    directory: pathlib.Path = tmp_path_factory.mktemp("sdk")
    with RedisServer() as store:
        env = base_env(directory, DURABLE_STREAM_URL=f"{store.url}?key_prefix=sdk:", SSE_PING_INTERVAL="1")
        with ServedStack(env, directory / "stack", servers=2, workers_per_server=1, celery_concurrency=8) as stack:
            yield Sdk(stack, store)
            assert 500 not in stack.statuses(), "the API answered 500"
