"""The asyncio client: the same surface and the same guarantees as the blocking one."""

from __future__ import annotations

import asyncio
import random

import pytest
from durable_workflow_client import (
    AsyncClient,
    AsyncWebClient,
    AuthenticationError,
    Event,
    EventsGoneError,
    InvalidResumeTokenError,
    NotFoundError,
    WorkflowFinished,
    WorkflowPaused,
)

from tests.sdk.conftest import FAST_RETRY, Sdk

UNKNOWN = "00000000-0000-4000-8000-000000000000"


def test_async_clients_cut_many_times_see_the_stored_runs(sdk: Sdk) -> None:
    rng = random.Random(23)

    async def follow(client: AsyncClient, index: int) -> tuple[list[Event], int, str | None]:
        stream = client.run({"name": f"Async {index}"}, "u1")
        events = [event async for event in stream]
        return events, stream.reconnects, stream.workflow_run_id

    async def main(url: str) -> list[tuple[list[Event], int, str | None]]:
        async with AsyncClient(url, sdk.keys["slow"], retry=FAST_RETRY) as client:
            return await asyncio.gather(*(follow(client, index) for index in range(3)))

    with sdk.relay(cut_after=lambda: rng.randint(600, 6000), seed=23) as relay:
        results = asyncio.run(main(relay.url))
    for events, reconnects, run_id in results:
        assert run_id is not None and reconnects >= 3
        assert [event.raw for event in events] == sdk.stored_events(run_id)
        assert isinstance(events[-1], WorkflowFinished) and events[-1].status == "succeeded"


def test_async_pause_human_input_and_typed_errors(sdk: Sdk) -> None:
    stream_reconnects: list[int] = []

    async def main() -> tuple[list[Event], list[dict[str, object]]]:
        url = sdk.stack.urls[1]
        async with AsyncClient(url, sdk.keys["greeting"]) as client:
            events: list[Event] = []
            stream = client.run({"name": "Io", "mood": "formal"}, "u1", continue_on_pause=True)
            async for event in stream:
                events.append(event)
                if isinstance(event, WorkflowPaused):
                    (reason,) = event.reasons
                    form = await client.get_form(reason.form_token)
                    assert [field.output_variable_name for field in form.inputs] == ["approved", "note"]
                    await client.submit_form(reason.form_token, "u1", {"approved": "true"})
            assert stream.task_id is not None and stream.workflow_run_id is not None
            stream_reconnects.append(stream.reconnects)
            assert (await client.get_run(stream.workflow_run_id, "u1")).status == "succeeded"
            stored = sdk.stored_events(stream.workflow_run_id)
            with pytest.raises(InvalidResumeTokenError):
                [e async for e in client.follow(stream.task_id, "u1", after="garbage")]
            with pytest.raises(NotFoundError):
                [e async for e in client.follow(UNKNOWN, "u1")]
            from_start = [e.raw async for e in client.follow(stream.workflow_run_id, "u1")]
            assert from_start == stored
            tail = [e async for e in client.follow(stream.workflow_run_id, "u1", from_start=False)]
            assert [e.event for e in tail] == ["workflow_finished"]
            sdk.trim(stream.workflow_run_id, keep_last=2)
            with pytest.raises(EventsGoneError) as gone:
                [e async for e in client.follow(stream.task_id, "u1", after=events[1].id)]
            assert gone.value.code == "resume_cursor_expired" and gone.value.run is not None
            assert gone.value.run.status == "succeeded"
            outcome = await client.run({"name": "Ju"}, "u1", stream=False)
            assert outcome.run.status == "succeeded"
        async with AsyncClient(url, "app-wrong") as wrong:
            with pytest.raises(AuthenticationError):
                await wrong.start({"name": "x"}, "u1")
        return events, stored

    events, stored = asyncio.run(main())
    assert stream_reconnects == [0], "going on after the pause is no reconnect"
    assert isinstance(events[-1], WorkflowFinished) and events[-1].outputs is not None
    assert [event.raw for event in events] == stored


def test_async_web_client_stop_and_resume(sdk: Sdk) -> None:
    async def main() -> tuple[list[Event], str | None]:
        async with AsyncWebClient(sdk.stack.urls[0], sdk.site_codes["long"]) as web:
            stream = web.run({"name": "Ka"})
            head = [await anext(stream) for _ in range(5)]
            await stream.aclose()
            assert stream.task_id is not None
            await web.stop(stream.task_id)
            passport = await web.get_passport()
        async with AsyncWebClient(sdk.stack.urls[1], sdk.site_codes["long"], passport=passport) as again:
            rest = [event async for event in again.follow(stream.task_id, after=head[-1].id)]
        return head + rest, stream.workflow_run_id

    events, run_id = asyncio.run(main())
    assert run_id is not None
    assert isinstance(events[-1], WorkflowFinished) and events[-1].status == "stopped"
    assert [event.raw for event in events] == sdk.stored_events(run_id)
