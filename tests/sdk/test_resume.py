"""Automatic resume: whatever breaks the connection, the caller sees the stored run exactly once, in order."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest
from durable_workflow_client import (
    Client,
    ConnectionLostError,
    Event,
    EventsGoneError,
    ReconnectInfo,
    RetryPolicy,
    TextChunk,
    WebClient,
    WorkflowFinished,
)

from harness.waiting import wait_until
from tests.sdk.conftest import FAST_RETRY, Sdk

CLIENTS = 4


def raw(events: list[Event]) -> list[dict[str, object]]:
    return [event.raw for event in events]


def test_runs_cut_at_random_points_many_times_arrive_exactly_as_stored(sdk: Sdk) -> None:
    rng = random.Random(16)
    # Each connection dies after 600 B to 6 KiB (a run is ~35 KiB): a cut lands inside an event, between
    # its lines, or between events, with a FIN or an RST, a dozen times or more per run.
    with sdk.relay(cut_after=lambda: rng.randint(600, 6000), seed=16) as relay:
        results: dict[int, tuple[list[Event], int, str | None]] = {}
        failures: list[BaseException] = []

        def follow(index: int) -> None:
            try:
                with Client(relay.url, sdk.keys["slow"], retry=FAST_RETRY) as client:
                    stream = client.run({"name": f"Ada {index}"}, "u1")
                    events = list(stream)
                    results[index] = (events, stream.reconnects, stream.workflow_run_id)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=follow, args=(index,)) for index in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures, failures
        assert relay.cuts >= CLIENTS * 5
    for events, reconnects, run_id in results.values():
        assert run_id is not None
        stored = sdk.stored_events(run_id)
        assert reconnects >= 3, "the relay should have cut this run several times"
        assert raw(events) == stored, f"run {run_id}: events lost, repeated or reordered over {reconnects} reconnects"
        assert isinstance(events[-1], WorkflowFinished) and events[-1].status == "succeeded"
    assert len(results) == CLIENTS


def test_a_web_client_resumes_the_same_way(sdk: Sdk) -> None:
    rng = random.Random(7)
    with (
        sdk.relay(cut_after=lambda: rng.randint(600, 6000), seed=7) as relay,
        WebClient(relay.url, sdk.site_codes["slow"], retry=FAST_RETRY) as client,
    ):
        stream = client.run({"name": "Web"})
        events = list(stream)
    assert stream.reconnects >= 3
    assert stream.workflow_run_id is not None
    assert raw(events) == sdk.stored_events(stream.workflow_run_id)
    assert client.passport.end_user.startswith("web-")


class BodyCutOnce(httpx.BaseTransport):
    """Hands the first run's POST answer over with its status and headers, and breaks its body before
    a byte of it is read: a client cut between the response headers and the first event."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.cut = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.method != "POST" or self.cut:
            return response
        self.cut += 1
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream.close()  # the connection goes, as the network took it
        return httpx.Response(response.status_code, headers=response.headers, stream=Broken())

    def close(self) -> None:
        self.inner.close()


class Broken(httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        raise httpx.ReadError("the connection was cut before the first event")
        yield b""  # a generator: the error comes when the body is read


def test_a_client_cut_before_the_first_event_resumes_by_the_ids_of_the_headers(sdk: Sdk) -> None:
    notes: list[ReconnectInfo] = []
    name = f"headers-{uuid.uuid4()}"
    transport = BodyCutOnce()
    with (
        httpx.Client(transport=transport, timeout=30) as http,
        Client(sdk.stack.urls[0], sdk.keys["slow"], retry=FAST_RETRY, on_reconnect=notes.append, http_client=http) as c,
    ):
        stream = c.run({"name": name}, "u1")
        events = list(stream)
    assert transport.cut == 1
    (note,) = notes
    assert note.last_event_id is None, "no event came before the cut: only the headers named the run"
    assert stream.workflow_run_id is not None and not stream.replayed
    # The reconnect asked for the run from its beginning (without a position the server starts at its tail).
    assert raw(events) == sdk.stored_events(stream.workflow_run_id)
    assert sdk.runs_with_input("u1", name) == 1


def test_a_killed_api_worker_mid_stream_is_invisible(sdk: Sdk) -> None:
    notes: list[ReconnectInfo] = []
    with sdk.relay() as relay:
        client = Client(relay.url, sdk.keys["long"], retry=FAST_RETRY, on_reconnect=notes.append)
        events: list[Event] = []
        killed = None
        with client, client.run({"name": "Kill"}, "u1") as stream:
            for event in stream:
                events.append(event)
                if killed is None and sum(isinstance(e, TextChunk) for e in events) == 20:
                    (connection,) = relay.active()
                    server = sdk.stack.servers[connection.upstream]
                    killed = server.kill_worker()
    assert killed is not None and notes, "the stream should have been cut by the kill"
    assert stream.workflow_run_id is not None
    assert raw(events) == sdk.stored_events(stream.workflow_run_id)
    assert events[-1].raw["data"]["status"] == "succeeded"
    # The reconnect went to the other server while the killed worker's master started a new one.
    assert {c.upstream for c in relay.connections} == {0, 1}
    for server in sdk.stack.servers:
        wait_until(lambda server=server: len(server.worker_pids()) == 1, 60, "gunicorn to replace its worker")


def test_a_caller_can_persist_the_last_token_and_resume_in_another_client(sdk: Sdk) -> None:
    with sdk.relay() as relay, Client(relay.url, sdk.keys["slow"]) as first:
        stream = first.run({"name": "Later"}, "u1")
        head = [next(stream) for _ in range(10)]
        token, task_id, run_id = stream.last_event_id, stream.task_id, stream.workflow_run_id
        stream.close()
    assert token == head[-1].id and task_id is not None and run_id is not None
    with Client(sdk.stack.urls[1], sdk.keys["slow"]) as second:
        rest = list(second.follow(task_id, "u1", after=token))
    assert raw(head + rest) == sdk.stored_events(run_id)


def test_retention_passing_the_client_is_a_typed_410_carrying_the_run(sdk: Sdk) -> None:
    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        stream = client.run({"name": "Gone"}, "u1")
        events = list(stream)
        assert stream.workflow_run_id is not None and stream.task_id is not None
        sdk.trim(stream.workflow_run_id, keep_last=2)
        with pytest.raises(EventsGoneError) as expired:
            list(client.follow(stream.task_id, "u1", after=events[1].id))
        with pytest.raises(EventsGoneError) as lost:
            list(client.follow(stream.task_id, "u1"))
        # The retained tail is still served to a client whose position is in it.
        assert raw(list(client.follow(stream.task_id, "u1", after=events[-3].id))) == raw(events[-2:])
    assert expired.value.code == "resume_cursor_expired" and expired.value.status == 410
    assert lost.value.code == "run_events_lost"
    for error in (expired.value, lost.value):
        assert error.run is not None and error.run.id == stream.workflow_run_id
        assert error.run.status == "succeeded" and error.run.outputs == events[-1].raw["data"]["outputs"]


def test_a_store_outage_is_retried_within_the_budget(sdk: Sdk) -> None:
    """503 ``stream_unavailable`` while the stream store is away; the stream goes on once it is back."""
    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        outcome = client.run({"name": "Outage"}, "u1", stream=False)
        assert outcome.run.status == "succeeded"
        notes: list[ReconnectInfo] = []
        patient = Client(
            sdk.stack.urls[0],
            sdk.keys["greeting"],
            retry=RetryPolicy(initial_delay=0.1, max_delay=0.5, max_attempts=50),
            on_reconnect=notes.append,
        )
        sdk.store.kill()
        results: list[list[Event] | EventsGoneError] = []

        def follow() -> None:
            try:
                results.append(list(patient.follow(outcome.workflow_run_id, "u1")))
            except EventsGoneError as gone:
                results.append(gone)

        follower = threading.Thread(target=follow)
        try:
            follower.start()
            wait_until(lambda: len(notes) >= 3, 30, "the client to be refused a few times")
        finally:
            # From this thread: a server started by a thread that ends would die with it (PDEATHSIG).
            sdk.store.start()
        follower.join(timeout=30)
        patient.close()
        tail = list(client.follow(outcome.workflow_run_id, "u1", from_start=False))
    (answer,) = results
    assert all(getattr(note.error, "status", None) == 503 for note in notes), notes
    # The store came back empty (no persistence): the run from its beginning is gone, with its row...
    assert isinstance(answer, EventsGoneError) and answer.code == "run_events_lost"
    assert answer.run is not None and answer.run.outputs == outcome.run.outputs
    # ...and its tail, a finished run's end, is told from that row.
    assert [event.event for event in tail] == ["workflow_finished"]
    assert tail[0].raw["data"]["outputs"] == outcome.run.outputs

    # A budget too small for the outage gives up with a typed error.
    sdk.store.kill()
    try:
        small = RetryPolicy(initial_delay=0.01, max_attempts=2)
        with Client(sdk.stack.urls[0], sdk.keys["greeting"], retry=small) as c, pytest.raises(ConnectionLostError) as e:
            list(c.follow(outcome.task_id, "u1"))
    finally:
        sdk.store.start()
    assert e.value.attempts == 2 and "503" in str(e.value)  # max_attempts, first try included
