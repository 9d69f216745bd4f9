"""The shared writer (``SSE_SHARED_WRITER``) under a real gunicorn gevent worker: the clients of a run
join one writer per process once they are level with it, and each still gets exactly its run — in
HTTP/1.0 and chunked HTTP/1.1, resumed mid-run, stopped at a pause or going on through it, stalled
while the others go on, gone, idle, and when the stream store dies under them."""

from __future__ import annotations

import contextlib
import copy
import json
import pathlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import gevent.socket
import pytest
import requests
from flask import Flask

from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED, connect
from api.gunicorn_conf import pause_logger
from api.services.delivery.clients import ENDED, Follower, Outcome, writable_socket
from api.services.delivery.endings import BATCH, PATIENCE
from api.services.delivery.watcher import RunWatcher
from api.services.delivery.writer import SharedWriters
from harness.app_env import base_env
from harness.redis_server import RedisServer, free_port
from harness.served_stack import ServedStack
from harness.sse import SseMessage, parse_sse
from harness.sse_client import Connection, read_run
from harness.waiting import wait_until
from tests.app import examples
from tests.app.test_operations_served import GREETING, Scraper
from tests.app.test_service_api import slow_greeting

pytestmark = pytest.mark.timeout(120)

PING_INTERVAL = 0.5
IDLE_TIMEOUT = 4


class Stack:
    def __init__(self, served: ServedStack, api: Scraper, store: RedisServer) -> None:
        self.served, self.api, self.store = served, api, store
        self.url = served.urls[0]

    def start(self, key: str, inputs: dict[str, Any], user: str = "u1") -> tuple[str, str]:
        response = requests.post(
            f"{self.url}/v1/workflows/run",
            headers={"Authorization": f"Bearer {key}"},
            json={"inputs": inputs, "user": user, "response_mode": "async"},
            timeout=30,
        )
        assert response.status_code == 202, response.text
        return response.json()["task_id"], response.json()["workflow_run_id"]

    def stored(self, run_id: str, *, sealed: bool = True) -> list[dict[str, Any]]:
        """The run's stored events: all of them (``sealed``), or those there are now."""
        events = []
        topic = workflow_run_topic("workflow", run_id)
        with connect(self.store.url) as backend, backend.topic(topic).subscribe_from_beginning() as subscription:
            while (record := subscription.receive(timeout=10 if sealed else 0.2)) is not CLOSED:
                if record is None:
                    assert not sealed, "the run's topic was never sealed"
                    break
                events.append(json.loads(unstamped(record.payload)))
        return events

    def wait_paused(self, run_id: str) -> list[dict[str, Any]]:
        def paused() -> list[dict[str, Any]] | None:
            events = self.stored(run_id, sealed=False)
            return events if events and events[-1]["event"] == "workflow_paused" else None

        return wait_until(paused, 20, f"run {run_id} to pause")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory: pathlib.Path = tmp_path_factory.mktemp("writer")
    api_port = free_port()
    with contextlib.ExitStack() as exits:
        store = exits.enter_context(RedisServer())
        env = base_env(
            directory,
            DURABLE_STREAM_URL=store.url,
            API_METRICS_BIND=f"127.0.0.1:{api_port}",
            METRICS_FLUSH_INTERVAL=0.1,
            SSE_PING_INTERVAL=PING_INTERVAL,
            SSE_IDLE_TIMEOUT=IDLE_TIMEOUT,
            WORKFLOW_LEASE_TTL=30,
        )
        served = exits.enter_context(
            ServedStack(env, directory / "stack", servers=1, workers_per_server=1, celery_concurrency=4)
        )
        yield Stack(served, Scraper(f"http://127.0.0.1:{api_port}/metrics"), store)


class RawClient:
    """An HTTP/1.0 client on a plain socket (no chunked encoding), read as far as the caller wants."""

    def __init__(
        self,
        url: str,
        key: str,
        task_id: str,
        *,
        query: str = "",
        receive_buffer: int | None = None,
        snapshot: bool = True,
    ) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.socket = socket.socket()
        if receive_buffer is not None:  # before connecting, so that the window starts small
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.socket.settimeout(30)
        self.socket.connect((host, int(port)))
        # From the run's beginning (a snapshot), as the tests compare whole runs; else from its live tail
        # (no cursor, no snapshot: Dify's default reader, what its web front end sends on every reconnect).
        path = f"/v1/workflow/{task_id}/events?user=u1{'&include_state_snapshot=true' if snapshot else ''}{query}"
        request = f"GET {path} HTTP/1.0\r\nAuthorization: Bearer {key}\r\n\r\n"
        self.socket.sendall(request.encode())
        self.messages = parse_sse(self._body())
        self.events: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.pings = 0
        self.ended = False

    def _body(self) -> Iterator[bytes]:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.socket.recv(65536)
            assert chunk, f"closed before the headers: {head!r}"
            head += chunk
        status, rest = head.split(b"\r\n\r\n", 1)
        assert status.startswith(b"HTTP/1.0 200") or status.startswith(b"HTTP/1.1 200"), status
        yield rest
        while chunk := self.socket.recv(65536):
            yield chunk
        self.ended = True
        self.socket.close()

    def read(self, events: int | None = None) -> RawClient:
        """Read until ``events`` more run events arrived, or to the end of the response."""
        wanted = None if events is None else len(self.events) + events
        if wanted is None:
            # Reading on to the end: a small receive buffer (a stalled client's) would take every few KB
            # through a delayed ACK, most of a minute for the 3 MB run below.
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        for message in self.messages:
            self._take(message)
            if wanted is not None and len(self.events) >= wanted:
                return self
        return self

    def read_until(self, event: str) -> RawClient:
        """Read until the last event read is ``event`` (or the response ends)."""
        while not self.ended and not (self.events and self.events[-1]["event"] == event):
            self.read(1)
        return self

    def _take(self, message: SseMessage) -> None:
        if message.is_ping:
            self.pings += 1
            return
        self.events.append(message.json)
        if message.id:
            self.ids.append(message.id)

    def close(self) -> None:
        self.socket.close()


def _in_thread(target: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(target(*args)), daemon=True)
    thread.start()
    return thread, result


def _events(connection: Connection) -> list[dict[str, Any]]:
    return [received.event for received in connection.events]


def test_the_clients_of_a_run_share_one_writer_and_each_gets_the_run_exactly(stack: Stack) -> None:
    key = stack.served.create_app(slow_greeting(delay=0.02, tokens=600))  # 12 s: time for all six to join
    task_id, run_id = stack.start(key, {"name": "Ada"})
    early = RawClient(stack.url, key, task_id).read(5)
    early.close()  # it comes back below with its third event's id
    chunked = [_in_thread(read_run, stack.url, key, task_id) for _ in range(3)]
    plain = [RawClient(stack.url, key, task_id) for _ in range(2)]
    plain_threads = [_in_thread(client.read) for client in plain]
    resumed = _in_thread(lambda: read_run(stack.url, key, task_id, last_event_id=early.ids[2]))

    # Six streams of one run are open, and one writer (with one subscription) serves them.
    wait_until(
        lambda: (
            stack.api.value("workflow_sse_streams_open") >= 6
            and stack.api.value("workflow_sse_writers_open") == 1
            and stack.api.value("durable_stream_subscriptions_open") == 1
        ),
        30,
        "six streams served by one writer on one subscription",
        interval=0.05,
    )
    for thread, _ in [*chunked, *plain_threads, resumed]:
        thread.join(60)
    stored = stack.stored(run_id)
    assert stored[0]["event"] == "workflow_started" and stored[-1]["event"] == "workflow_finished"
    for _, (connection,) in chunked:
        assert connection.ended == "finished" and _events(connection) == stored
    for client in plain:
        assert client.ended and client.events == stored
    (connection,) = resumed[1]
    assert connection.ended == "finished" and _events(connection) == stored[3:]

    # The writer's ids are resume tokens like any other: a reconnect after one gets exactly the rest.
    again = read_run(stack.url, key, task_id, last_event_id=plain[0].ids[-10])
    assert _events(again) == stored[-9:]
    wait_until(
        lambda: stack.api.value("workflow_sse_streams_open") == 0 and stack.api.value("workflow_sse_writers_open") == 0,
        10,
        "every stream and writer to be gone",
    )


def test_a_client_that_stops_reading_holds_nobody_up_and_misses_nothing(stack: Stack) -> None:
    definition = copy.deepcopy(slow_greeting(delay=0.002, tokens=200))
    # 3 MB of events: more than the socket buffers of both ends hold.
    definition = examples.script_model(definition, response=" ".join(f"w{i}" + "x" * 16000 for i in range(200)))
    key = stack.served.create_app(definition)
    slow_before = stack.api.value("workflow_sse_handbacks_total", reason="slow")
    task_id, run_id = stack.start(key, {"name": "Ada"})
    stalled = RawClient(stack.url, key, task_id, receive_buffer=4096).read(3)
    # A client from the live tail, stalled too: handed back, it goes on from where it was, never from
    # the run's start (the writer had delivered at least the three events above when it arrived).
    stalled_tail = RawClient(stack.url, key, task_id, receive_buffer=4096, snapshot=False).read(1)
    thread, result = _in_thread(read_run, stack.url, key, task_id)
    thread.join(60)
    # The other client read the whole run while these read nothing.
    (fast,) = result
    assert fast.ended == "finished"
    stack.api.wait_for("workflow_sse_handbacks_total", slow_before + 2, reason="slow")
    stored = stack.stored(run_id)
    assert _events(fast) == stored
    assert stalled.read().ended and stalled.events == stored
    assert stalled_tail.read().ended
    start = len(stored) - len(stalled_tail.events)
    assert start >= 3 and stalled_tail.events == stored[start:], "not exactly what followed its arrival"


def test_tail_clients_of_a_paused_run_join_its_writer_and_get_exactly_what_follows(
    stack: Stack, request: pytest.FixtureRequest
) -> None:
    """Dify's default reader (no cursor, no snapshot) at a run waiting for a form: served by the run's
    writer (one subscription for all), nothing of the past, then exactly what the run does next."""
    key = stack.served.create_app(GREETING)
    task_id, run_id = stack.start(key, {"name": "Ida", "mood": "formal"})
    paused = stack.wait_paused(run_id)
    shared_before = stack.api.value("workflow_sse_arrivals_total", path="shared")
    subscriptions_before = stack.api.value("durable_stream_subscriptions_open")
    clients = [RawClient(stack.url, key, task_id, snapshot=False) for _ in range(6)]
    for client in clients:
        request.addfinalizer(client.close)
    # Each got its first bytes (a ping) and nothing else: a tail starts after the pause it did not see.
    for client in clients:
        client.read(0)
    stack.api.wait_for("workflow_sse_arrivals_total", shared_before + 6, path="shared")
    wait_until(
        lambda: (
            stack.api.value("workflow_sse_writers_open") == 1
            and stack.api.value("durable_stream_subscriptions_open") == subscriptions_before + 1
        ),
        10,
        "six tail clients served by one writer on one subscription",
    )
    answer = requests.post(
        f"{stack.url}/v1/workflows/runs/{run_id}/human-input",
        headers={"Authorization": f"Bearer {key}"},
        json={"user": "u1", "inputs": {"approved": "true"}},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    stored = stack.stored(run_id)
    assert stored[: len(paused)] == paused and stored[-1]["event"] == "workflow_finished"
    for client in clients:
        assert client.read().ended
        assert client.events == stored[len(paused) :]
        assert client.pings >= 1


def test_a_streaming_start_is_delivered_by_its_runs_writer(stack: Stack) -> None:
    """``POST /workflows/run`` in streaming mode: the response joins the new run's writer before the run
    is dispatched, so it gets every event, and tail clients arriving meanwhile share that writer."""
    key = stack.served.create_app(slow_greeting(delay=0.02, tokens=150))
    # The writers of the module's earlier runs end with their clients (at the latest, idle ones).
    wait_until(lambda: stack.api.value("workflow_sse_writers_open") == 0, 3 * IDLE_TIMEOUT, "no writer left")
    shared_before = stack.api.value("workflow_sse_arrivals_total", path="shared")
    host, port = stack.url.removeprefix("http://").split(":")
    body = json.dumps({"inputs": {"name": "Jo"}, "user": "u1", "response_mode": "streaming"}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        raw.sendall(
            b"POST /v1/workflows/run HTTP/1.0\r\nAuthorization: Bearer %b\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (key.encode(), len(body), body)
        )
        received = b""
        while b"\r\n\r\n" not in received:
            received += raw.recv(65536)
        head, rest = received.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.0 200"), head
        task_id = next(line.split(b": ", 1)[1] for line in head.split(b"\r\n") if line.startswith(b"X-Task-Id"))
        run_id = next(
            line.split(b": ", 1)[1] for line in head.split(b"\r\n") if line.startswith(b"X-Workflow-Run-Id")
        ).decode()
        tail = RawClient(stack.url, key, task_id.decode(), snapshot=False).read(1)
        stack.api.wait_for("workflow_sse_arrivals_total", shared_before + 2, path="shared")
        assert stack.api.value("workflow_sse_writers_open") == 1

        def chunks() -> Iterator[bytes]:
            yield rest
            while chunk := raw.recv(65536):
                yield chunk

        started = [message.json for message in parse_sse(chunks()) if not message.is_ping]
    stored = stack.stored(run_id)
    assert started == stored and stored[0]["event"] == "workflow_started"
    tail.read()
    assert tail.ended and tail.events == stored[len(stored) - len(tail.events) :] and len(tail.events) >= 1


def test_a_pause_ends_the_joined_clients_that_stop_at_pauses_and_no_others(stack: Stack) -> None:
    definition = copy.deepcopy(GREETING)
    definition = examples.script_model(definition, response=" ".join(f"word{i}" for i in range(150)))
    definition = examples.script_model(definition, token_delay=0.02)
    key = stack.served.create_app(definition)
    task_id, run_id = stack.start(key, {"name": "Eve", "mood": "formal"})
    stopping = RawClient(stack.url, key, task_id).read(3)
    going_on = RawClient(stack.url, key, task_id, query="&continue_on_pause=true").read(3)
    wait_until(lambda: stack.api.value("workflow_sse_writers_open") == 1, 10, "the clients to join a writer")
    stopping.read()
    assert stopping.ended and stopping.events[-1]["event"] == "workflow_paused", [
        (e["event"], e.get("data", {}).get("node_id")) for e in stopping.events[-6:]
    ]
    going_on.read_until("workflow_paused")  # and the stream stays open
    assert going_on.events[-1]["event"] == "workflow_paused" and not going_on.ended
    answer = requests.post(
        f"{stack.url}/v1/workflows/runs/{run_id}/human-input",
        headers={"Authorization": f"Bearer {key}"},
        json={"user": "u1", "inputs": {"approved": "true"}},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    going_on.read()
    stored = stack.stored(run_id)
    assert going_on.ended and going_on.events == stored and stored[-1]["data"]["status"] == "succeeded"
    assert stopping.events == stored[: len(stopping.events)]


def test_joined_clients_are_pinged_dropped_when_gone_and_ended_when_idle(stack: Stack) -> None:
    key = stack.served.create_app(GREETING)
    task_id, run_id = stack.start(key, {"name": "Gus", "mood": "formal"})
    stored = stack.wait_paused(run_id)
    open_before = stack.api.value("workflow_sse_streams_open")
    staying = RawClient(stack.url, key, task_id, query="&continue_on_pause=true").read(len(stored))
    leaving = RawClient(stack.url, key, task_id, query="&continue_on_pause=true").read(len(stored))
    wait_until(
        lambda: (
            stack.api.value("workflow_sse_streams_open") == open_before + 2
            and stack.api.value("workflow_sse_writers_open") == 1
        ),
        10,
        "both streams open, served by a writer",
    )
    leaving.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    leaving.close()  # a reset: the writer's next ping fails
    wait_until(lambda: stack.api.value("workflow_sse_streams_open") == open_before + 1, 5, "the gone client dropped")
    staying.read()  # pings until the idle timeout ends the response
    assert staying.ended and staying.pings >= 3
    assert staying.events == stored
    wait_until(lambda: stack.api.value("workflow_sse_writers_open") == 0, 5, "the writer to be gone")


def test_a_store_failure_reaches_every_joined_client_as_an_error_event(stack: Stack) -> None:
    key = stack.served.create_app(GREETING)
    task_id, run_id = stack.start(key, {"name": "Hal", "mood": "formal"})
    stored = stack.wait_paused(run_id)
    failed_before = stack.api.value("workflow_sse_handbacks_total", reason="failed")
    clients = [RawClient(stack.url, key, task_id, query="&continue_on_pause=true").read(len(stored)) for _ in range(2)]
    wait_until(lambda: stack.api.value("workflow_sse_writers_open") == 1, 10, "the clients to join a writer")
    stack.store.kill()
    try:
        for client in clients:
            client.read()
            assert client.ended
            assert client.events[: len(stored)] == stored
            error = client.events[len(stored) :]
            assert [event.get("code") for event in error] == ["stream_unavailable"], error
        stack.api.wait_for("workflow_sse_handbacks_total", failed_before + 2, reason="failed")
    finally:
        stack.store.start()


def test_only_a_gunicorn_gevent_socket_in_the_clear_is_written_by_a_writer() -> None:
    with gevent.socket.socket() as cooperative, socket.socket() as plain:
        assert writable_socket({"gunicorn.socket": cooperative, "REQUEST_METHOD": "GET"}) is cooperative
        assert writable_socket({"gunicorn.socket": cooperative, "REQUEST_METHOD": "HEAD"}) is None
        assert writable_socket({"gunicorn.socket": plain, "REQUEST_METHOD": "GET"}) is None  # a sync worker
        assert writable_socket({"REQUEST_METHOD": "GET"}) is None  # another server


def test_ended_responses_close_in_batches_after_the_events_due() -> None:
    """A run's end ends all its clients at once; their closes must not hold up other runs' events."""
    writers = SharedWriters(
        Flask(__name__),
        RunWatcher(Flask(__name__), interval=1, grace=1),
        ping_interval=10,
        idle_timeout=600,
    )
    clients = [Follower(None, chunked=True, continue_on_pause=True) for _ in range(2 * BATCH + 1)]
    order: list[Any] = []
    loop = gevent.get_hub().loop

    def ending(index: int, client: Follower) -> None:
        outcome: Outcome = client.waiter.get()
        order.append((index, outcome.kind))
        if index == 0:  # a run's next event, due while the first batch is being ended
            loop.run_callback(order.append, "next event")

    greenlets = [gevent.spawn(ending, index, client) for index, client in enumerate(clients)]
    gevent.sleep(0)  # every client parked, as under a writer
    for client in clients:
        writers.finish(client, ENDED)
    loop.run_callback(order.append, "event")
    assert gevent.joinall(greenlets, timeout=10) and all(greenlet.successful() for greenlet in greenlets)

    assert order[0] == "event"  # nothing is ended before what was due
    assert order.index("next event") == 1 + BATCH  # the next batch waits for it
    assert [entry for entry in order if isinstance(entry, tuple)] == [(index, "ended") for index in range(len(clients))]


def test_a_worker_that_is_never_idle_still_ends_responses() -> None:
    writers = SharedWriters(
        Flask(__name__),
        RunWatcher(Flask(__name__), interval=1, grace=1),
        ping_interval=10,
        idle_timeout=600,
    )
    client = Follower(None, chunked=True, continue_on_pause=True)
    ended: list[float] = []
    busy_until = time.monotonic() + 2.0

    def busy() -> None:  # always something due: the loop is never idle
        while time.monotonic() < busy_until:
            gevent.sleep(0)

    def ending() -> None:
        client.waiter.get()
        ended.append(time.monotonic())

    greenlets = [gevent.spawn(busy), gevent.spawn(ending)]
    gevent.sleep(0)
    started = time.monotonic()
    writers.finish(client, ENDED)
    assert gevent.joinall(greenlets, timeout=10)
    assert ended and ended[0] - started < 10 * PATIENCE  # not when the worker is idle again, 2 s on


def test_the_gc_pause_log_names_only_slow_full_collections() -> None:
    lines: list[str] = []

    class Log:
        def warning(self, message: str, *args: object) -> None:
            lines.append(message % args)

    on_collection = pause_logger(Log(), threshold=0.0)
    on_collection("start", {"generation": 1, "collected": 0, "uncollectable": 0})
    on_collection("stop", {"generation": 1, "collected": 3, "uncollectable": 0})
    on_collection("start", {"generation": 2, "collected": 0, "uncollectable": 0})
    on_collection("stop", {"generation": 2, "collected": 7, "uncollectable": 0})
    assert len(lines) == 1 and lines[0].startswith("a full GC collection took") and "(7 objects collected)" in lines[0]
    quiet = pause_logger(Log(), threshold=60.0)
    quiet("start", {"generation": 2, "collected": 0, "uncollectable": 0})
    quiet("stop", {"generation": 2, "collected": 1, "uncollectable": 0})
    assert len(lines) == 1
