"""A run's start carries an ``Idempotency-Key``: a POST cut before its answer is sent again with the
same key, and the server starts one run however often it arrives.

The relay cuts the first connection at the first byte of the answer: the server has read the whole
request (and started the run) but the client gets no status line, exactly the case where it cannot
know whether the run exists. Each test's inputs carry a marker of its own, by which the app database
is asked how many runs there are.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest
from durable_workflow_client import AsyncClient, Client, ConnectionLostError, IdempotencyKeyReusedError

from tests.sdk.conftest import FAST_RETRY, Sdk


def first_cut_at_once() -> Callable[[], int | None]:
    """The relay's budgets: the first connection gets no byte of its answer, the others all of it."""
    budgets = [0]
    return lambda: budgets.pop(0) if budgets else None


def marker() -> str:
    return f"idempotency-{uuid.uuid4()}"


def test_a_streaming_start_cut_before_its_answer_starts_one_run(sdk: Sdk) -> None:
    name = marker()
    with sdk.relay(cut_after=first_cut_at_once()) as relay, Client(relay.url, sdk.keys["slow"], retry=FAST_RETRY) as c:
        stream = c.run({"name": name}, "u1")
        events = list(stream)
        assert relay.cuts == 1
    assert stream.replayed and stream.reconnects == 1 and stream.workflow_run_id is not None
    # A replayed stream is the run from its start: nothing lost, nothing twice.
    assert [event.raw for event in events] == sdk.stored_events(stream.workflow_run_id)
    assert sdk.runs_with_input("u1", name) == 1


def test_blocking_and_background_starts_cut_before_their_answer_start_one_run_each(sdk: Sdk) -> None:
    blocking, background = marker(), marker()
    with (
        sdk.relay(cut_after=first_cut_at_once()) as relay,
        Client(relay.url, sdk.keys["greeting"], retry=FAST_RETRY) as c,
    ):
        outcome = c.run({"name": blocking}, "u1", stream=False)
        assert relay.cuts == 1
    with (
        sdk.relay(cut_after=first_cut_at_once()) as relay,
        Client(relay.url, sdk.keys["greeting"], retry=FAST_RETRY) as c,
    ):
        handle = c.start({"name": background}, "u1")
        assert relay.cuts == 1
    assert outcome.replayed and outcome.run.status == "succeeded"
    assert handle.replayed
    assert sdk.runs_with_input("u1", blocking) == 1 and sdk.runs_with_input("u1", background) == 1


def test_without_a_key_a_cut_start_is_not_sent_again(sdk: Sdk) -> None:
    name = marker()
    with (
        sdk.relay(cut_after=first_cut_at_once()) as relay,
        Client(relay.url, sdk.keys["greeting"], retry=FAST_RETRY) as c,
    ):
        with pytest.raises(ConnectionLostError, match="may have taken effect"):
            list(c.run({"name": name}, "u1", idempotency_key=False))
        assert len(relay.connections) == 1
    # The run the lost answer was for exists; the client did not start a second one.
    assert sdk.runs_with_input("u1", name) == 1


def test_the_same_key_is_the_same_run_and_another_body_is_refused(sdk: Sdk) -> None:
    key, name = str(uuid.uuid4()), marker()
    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        first = client.start({"name": name}, "u1", idempotency_key=key)
        again = client.start({"name": name}, "u1", idempotency_key=key)
        with pytest.raises(IdempotencyKeyReusedError) as reused:
            client.start({"name": name + "!"}, "u1", idempotency_key=key)
        other = client.start({"name": name}, "u1")  # a fresh key: a run of its own
    assert (again.task_id, again.workflow_run_id) == (first.task_id, first.workflow_run_id)
    assert not first.replayed and again.replayed and not other.replayed
    assert reused.value.status == 422 and reused.value.code == "idempotency_key_reused"
    assert other.workflow_run_id != first.workflow_run_id
    assert sdk.runs_with_input("u1", name) == 2


def test_the_asyncio_client_sends_a_cut_start_again_with_the_same_key(sdk: Sdk) -> None:
    name = marker()

    async def main(url: str) -> tuple[list[dict[str, object]], str | None, bool]:
        async with AsyncClient(url, sdk.keys["slow"], retry=FAST_RETRY) as client:
            stream = client.run({"name": name}, "u1")
            events = [event.raw async for event in stream]
            return events, stream.workflow_run_id, stream.replayed

    with sdk.relay(cut_after=first_cut_at_once()) as relay:
        events, run_id, replayed = asyncio.run(main(relay.url))
        assert relay.cuts == 1
    assert replayed and run_id is not None
    assert events == sdk.stored_events(run_id)
    assert sdk.runs_with_input("u1", name) == 1
