"""Under real gunicorn gevent workers: clients that keep dropping and reconnecting with Last-Event-ID
see every event of the run exactly once, in order, whichever worker serves each reconnect."""

from __future__ import annotations

import contextlib
import itertools
import json
import pathlib
import random
import threading
import uuid
from collections.abc import Iterator

import pytest

from api.configs import AppConfig
from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, connect
from api.extensions.ext_durable_stream import stream_url_with_retention
from harness.app_env import base_env
from harness.nats_server import private_nats_server
from harness.served_stack import ServedStack
from harness.services import redis_url
from harness.sse_client import FollowedRun, Follower
from tests.app.test_service_api import slow_greeting

RUNS = 6
DISCONNECTS_PER_RUN = 4


def stream_urls(tmp: pathlib.Path) -> dict[str, str]:
    return {
        "sqlite": f"sqlite:///{tmp / 'streams.db'}",
        "redis": redis_url(0, f"key_prefix=gevent-{uuid.uuid4().hex[:8]}:"),
    }


@pytest.fixture(params=["sqlite", "redis", "nats"])
def served(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[ServedStack]:
    """Two gunicorn masters with one gevent worker each: every reconnect picks one at random.

    Two workers of one master would share its socket, and the kernel may give every reconnect to
    the same one; two masters make a reconnect to the other process certain (the clients' seeds are
    fixed). NATS runs on a private current server (the shared one is too old for the adapter)."""
    with contextlib.ExitStack() as stack:
        if request.param == "nats":
            url = stack.enter_context(private_nats_server()).url + f"?stream=gevent-{uuid.uuid4().hex[:8]}"
        else:
            url = stream_urls(tmp_path)[request.param]
        env = base_env(tmp_path, DURABLE_STREAM_URL=url, SSE_PING_INTERVAL="1")
        yield stack.enter_context(
            ServedStack(env, tmp_path / "stack", servers=2, workers_per_server=1, celery_concurrency=8)
        )


def test_dropping_clients_resume_exactly_through_gunicorn_gevent(served: ServedStack) -> None:
    key = served.create_app(slow_greeting(delay=0.004, tokens=150))
    results: list[FollowedRun] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        cuts = list(itertools.accumulate(rng.randint(1, 40) for _ in range(DISCONNECTS_PER_RUN)))
        results.append(Follower(served.urls, key, rng=rng, cuts=cuts, inputs={"name": "Ada"}).follow())

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(RUNS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(results) == RUNS
    assert all(run.failure is None and run.finished for run in results), [run.failure for run in results]

    # The URL the app itself uses (with its default retention): NATS refuses other stream options.
    with connect(stream_url_with_retention(AppConfig(**served.env))) as backend:  # type: ignore[arg-type]
        for run in results:
            assert run.run_id is not None
            stored = []
            with backend.topic(workflow_run_topic("workflow", run.run_id)).subscribe_from_beginning() as subscription:
                while (record := subscription.receive(timeout=5)) is not CLOSED:
                    assert record is not None, "the run's topic was never sealed"
                    stored.append(json.loads(unstamped(record.payload)))
            assert run.reconnects >= 1
            assert run.received == stored, (
                f"run {run.run_id}: events lost, repeated or reordered across {run.reconnects} reconnects"
            )
            assert stored[0]["event"] == "workflow_started" and stored[-1]["data"]["status"] == "succeeded"

    served_by = [sum(server.served("/events").values()) for server in served.servers]
    assert all(served_by), f"reconnects were all served by one process: {served_by}"
