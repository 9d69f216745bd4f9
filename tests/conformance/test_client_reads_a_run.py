"""A workflow run read through the gateway mounted in the API, by a client written by someone else.

The API runs as deployed (gunicorn ``-k gevent`` and a Celery worker, ``harness/served_stack.py``) with
``DURABLE_STREAMS_GATEWAY_PREFIX`` set. ``@durable-streams/client`` (npm, pinned in ``package.json``)
reads a slow run live through a TCP relay (``harness/tcp_relay.py``) that the test cuts mid-run; the
client resumes from the last offset it delivered (``read_run.mjs``). What it delivered must be exactly
the run's stored events, each once and in order, and it must have seen the stream end (Stream-Closed,
the run's topic sealed). Plain HTTP reads (catch-up, long-poll) and access by another app's key too.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, connect
from harness.app_env import base_env
from harness.processes import die_with_parent, process_env
from harness.served_stack import ServedStack
from harness.tcp_relay import TcpRelay
from harness.waiting import wait_until
from tests.app.test_service_api import slow_greeting

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

HERE = pathlib.Path(__file__).resolve().parent
PREFIX = "/durable-streams"
READER = HERE / "read_run.mjs"
CLIENT_PACKAGE = HERE / "node_modules" / "@durable-streams" / "client" / "package.json"
#: Pinned in package.json (and package-lock.json): the client version this test proves.
CLIENT_VERSION = "0.2.7"
LONG_POLL_SECONDS = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedStack]:
    directory: pathlib.Path = tmp_path_factory.mktemp("gateway-run")
    env = base_env(
        directory,
        DURABLE_STREAMS_GATEWAY_PREFIX=PREFIX,
        DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS=LONG_POLL_SECONDS,
    )
    with ServedStack(env, directory / "stack", servers=1, workers_per_server=2, celery_concurrency=4) as served:
        yield served


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def start_run(stack: ServedStack, key: str) -> str:
    response = requests.post(
        f"{stack.urls[0]}/v1/workflows/run",
        json={"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "async"},
        headers=auth(key),
        timeout=30,
    )
    assert response.status_code == 202, response.text
    run_id: str = response.json()["workflow_run_id"]
    return run_id


def stored(stack: ServedStack, run_id: str) -> list[dict[str, Any]]:
    """The run's events as its topic holds them now (what the gateway must serve, envelopes cut off)."""
    events = []
    with (
        connect(stack.env["DURABLE_STREAM_URL"]) as backend,
        backend.topic(workflow_run_topic("workflow", run_id)).subscribe_from_beginning() as subscription,
    ):
        while (record := subscription.receive(timeout=0)) is not None and record is not CLOSED:
            events.append(json.loads(unstamped(record.payload)))
    return events


def sealed(stack: ServedStack, run_id: str) -> bool:
    with connect(stack.env["DURABLE_STREAM_URL"]) as backend:
        info = backend.admin.topic_info(workflow_run_topic("workflow", run_id))
    return info is not None and info.sealed


def finished_and_sealed(stack: ServedStack, run_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    wait_until(lambda: sealed(stack, run_id), timeout, f"run {run_id}'s topic to be sealed")
    events = stored(stack, run_id)
    assert events[0]["event"] == "workflow_started" and events[-1]["event"] == "workflow_finished"
    return events


class NodeReader:
    """``node read_run.mjs`` in the background; its JSON lines collected as they come."""

    def __init__(self, url: str, key: str, live: str) -> None:
        node = shutil.which("node") or "node"
        self.process = subprocess.Popen(
            [node, str(READER), url, key, live],
            cwd=HERE,
            env=process_env({}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        self._lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stdout = threading.Thread(target=self._collect, daemon=True)
        self._stdout.start()

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for text in self.process.stdout:
            with self._lock:
                self._lines.append(json.loads(text))

    def lines(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._lines)

    def items(self) -> list[Any]:
        return [item for line in self.lines() if line["type"] == "batch" for item in line["items"]]

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        """Until the script exits; its lines (it must exit 0)."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the client did not finish within {timeout:g} s: {self.lines()[-5:]}") from None
        self._stdout.join(timeout=10)
        stderr = self.process.stderr.read() if self.process.stderr is not None else ""
        assert self.process.returncode == 0, f"exit {self.process.returncode}: {stderr}\n{self.lines()[-5:]}"
        return self.lines()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def node_reader(url: str, key: str, live: str) -> Iterator[NodeReader]:
    reader = NodeReader(url, key, live)
    try:
        yield reader
    finally:
        reader.stop()


def offset_of(url: str) -> str:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["offset"][0]


def test_the_pinned_client_is_installed() -> None:
    assert CLIENT_PACKAGE.exists(), "run `make conformance-deps` (npm ci in tests/conformance)"
    assert json.loads(CLIENT_PACKAGE.read_text())["version"] == CLIENT_VERSION
    declared = json.loads((HERE / "package.json").read_text())["dependencies"]
    assert declared["@durable-streams/client"] == CLIENT_VERSION


@pytest.mark.parametrize("live", ["sse", "long-poll"])
def test_the_npm_client_reads_a_run_live_through_a_cut_exactly_once(stack: ServedStack, live: str) -> None:
    key = stack.create_app(slow_greeting(delay=0.03, tokens=300))  # about 9 s of text
    run_id = start_run(stack, key)
    wait_until(lambda: stored(stack, run_id), 30, f"run {run_id}'s first event")
    server = stack.servers[0]
    with (
        TcpRelay([("127.0.0.1", server.port)]) as relay,
        node_reader(f"{relay.url}{PREFIX}/runs/{run_id}", key, live) as reader,
    ):
        # The client follows the run live for a while ...
        wait_until(lambda: len(reader.items()) >= 40, 60, "the client to read 40 events live")
        assert not sealed(stack, run_id), "the run ended before the cut: make it slower"
        # ... then every connection between it and the server dies at once, as a network does.
        seen_before_cut = len(reader.lines())
        assert relay.cut_all("rst") >= 1
        lines = reader.wait(timeout=90)
    events = finished_and_sealed(stack, run_id)
    # What the client printed, kept beside the servers' logs for a failure's diagnosis.
    (stack.directory / f"client-{live}-{run_id}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    # Exactly the run's stored events: every one once, in order, nothing lost, nothing repeated.
    items = [item for line in lines if line["type"] == "batch" for item in line["items"]]
    assert len(items) == len(events)
    assert items == events
    # The client saw the stream end (the sealed topic is Stream-Closed), not just the last event.
    batches = [line for line in lines if line["type"] == "batch"]
    assert lines[-1]["type"] == "end" and batches[-1]["streamClosed"]
    assert not any(batch["streamClosed"] for batch in batches[:-1])

    # The cut happened mid-run, and the client resumed from the offset it had reached, not from the start.
    assert relay.cuts >= 1 and len(relay.connections) >= 2
    requests_made = [line for line in lines if line["type"] == "request"]
    assert offset_of(requests_made[0]["url"]) == "-1"
    assert all(offset_of(line["url"]) != "-1" for line in requests_made[1:]), requests_made
    before_cut = [line for line in lines[:seen_before_cut] if line["type"] == "batch"]
    reached = before_cut[-1]["offset"]
    assert sum(len(batch["items"]) for batch in before_cut) < len(events), "nothing was left to resume"
    resumed = next(line for line in lines[seen_before_cut:] if line["type"] == "request")
    assert offset_of(resumed["url"]) >= reached  # offsets compare as strings, in stream order
    # Not necessarily a delivered batch's offset: the client takes the next offset from a response's
    # headers and asks on from there while its body is still read; a cut during that body leaves a
    # request from an offset whose batch was never delivered (the next session then resumes from the
    # last delivered one). items == events above shows that nothing was skipped or repeated.
    assert offset_of(resumed["url"]) <= batches[-1]["offset"]


def test_plain_http_reads_a_run_by_catch_up_and_long_poll(stack: ServedStack) -> None:
    key = stack.create_app(slow_greeting(delay=0.02, tokens=150))  # about 3 s of text
    run_id = start_run(stack, key)
    url = f"{stack.urls[0]}{PREFIX}/runs/{run_id}"
    wait_until(lambda: stored(stack, run_id), 30, f"run {run_id}'s first event")

    # Catch-up from the start while the run goes on: JSON, a next offset, not closed yet.
    first = requests.get(url, params={"offset": "-1"}, headers=auth(key), timeout=30)
    assert first.status_code == 200, first.text
    assert first.headers["Content-Type"].startswith("application/json")
    assert "Stream-Closed" not in first.headers
    read = first.json()
    assert read and read[0]["event"] == "workflow_started"
    offset = first.headers["Stream-Next-Offset"]

    # Long-polls from each next offset until the stream says it is closed.
    answers: list[int] = []

    def poll() -> bool:
        nonlocal offset
        response = requests.get(url, params={"offset": offset, "live": "long-poll"}, headers=auth(key), timeout=30)
        assert response.status_code in (200, 204), response.text
        answers.append(response.status_code)
        if response.status_code == 200:
            read.extend(response.json())
        offset = response.headers["Stream-Next-Offset"]
        return response.headers.get("Stream-Closed") == "true"

    wait_until(poll, 60, "long-polls to reach the closed end of the run", interval=0)
    events = finished_and_sealed(stack, run_id)
    assert read == events
    assert 200 in answers, "no long-poll was answered with events the run appended while it waited"

    # Once closed: a catch-up of everything says so, and a long-poll at the end answers at once (204).
    whole = requests.get(url, params={"offset": "-1"}, headers=auth(key), timeout=30)
    assert whole.status_code == 200 and whole.json() == events
    assert whole.headers["Stream-Closed"] == "true" and whole.headers["Stream-Up-To-Date"] == "true"
    assert whole.headers["Stream-Next-Offset"] == offset
    at_end = requests.get(url, params={"offset": offset, "live": "long-poll"}, headers=auth(key), timeout=30)
    assert at_end.status_code == 204 and at_end.headers["Stream-Closed"] == "true"
    assert at_end.elapsed.total_seconds() < LONG_POLL_SECONDS
    head = requests.head(url, headers=auth(key), timeout=30)
    assert head.status_code == 200 and head.headers["Stream-Next-Offset"] == offset
    # A resume from the middle is exactly the rest.
    middle = requests.get(url, params={"offset": first.headers["Stream-Next-Offset"]}, headers=auth(key), timeout=30)
    assert middle.status_code == 200 and first.json() + middle.json() == events


def test_only_the_runs_app_key_reads_it(stack: ServedStack) -> None:
    key = stack.create_app(slow_greeting(delay=0.001, tokens=20))
    other = stack.create_app(slow_greeting(delay=0.001, tokens=20))
    run_id = start_run(stack, key)
    events = finished_and_sealed(stack, run_id)
    url = f"{stack.urls[0]}{PREFIX}/runs/{run_id}"
    assert requests.get(url, params={"offset": "-1"}, headers=auth(key), timeout=30).json() == events

    # Another app's key: the run does not exist for it, however it asks.
    for params in ({"offset": "-1"}, {"offset": "-1", "live": "long-poll"}, {"offset": "-1", "live": "sse"}):
        refused = requests.get(url, params=params, headers=auth(other), timeout=30)
        assert refused.status_code == 404, (params, refused.status_code)
        assert run_id not in refused.text and "workflow" not in refused.text
    assert requests.head(url, headers=auth(other), timeout=30).status_code == 404
    # No key, or a key that is no key: 401; and the run is read-only even for its own app.
    assert requests.get(url, params={"offset": "-1"}, timeout=30).status_code == 401
    assert requests.get(url, params={"offset": "-1"}, headers=auth("app-nope"), timeout=30).status_code == 401
    json_body = {**auth(key), "Content-Type": "application/json"}
    assert requests.post(url, data="[1]", headers=json_body, timeout=30).status_code == 403
    assert requests.delete(url, headers=auth(key), timeout=30).status_code == 403
    assert requests.put(url, headers=json_body, timeout=30).status_code == 403
    assert requests.get(url, params={"offset": "-1"}, headers=auth(key), timeout=30).json() == events
