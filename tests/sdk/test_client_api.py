"""The client's calls against the real API: typed errors without retries, pause and human-input forms,
attaching to a run from its beginning or its tail, stop."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest
from durable_workflow_client import (
    AuthenticationError,
    Client,
    ConflictError,
    ConnectionLostError,
    Event,
    FormSubmittedError,
    HumanInputFormFilled,
    HumanInputRequired,
    InvalidRequestError,
    InvalidResumeTokenError,
    NodeFinished,
    NodeStarted,
    NotFoundError,
    RetryPolicy,
    TextChunk,
    WebClient,
    WorkflowFinished,
    WorkflowPaused,
    WorkflowStarted,
)

from harness.processes import free_port
from tests.sdk.conftest import FAST_RETRY, Sdk

UNKNOWN = "00000000-0000-4000-8000-000000000000"


@contextlib.contextmanager
def counting_client(sdk: Sdk, key: str, sent: list[str]) -> Iterator[Client]:
    """A client whose every request (first sends and resends) is listed in ``sent``."""
    hooks = {"request": [lambda request: sent.append(f"{request.method} {request.url.raw_path.decode()}")]}
    with httpx.Client(event_hooks=hooks) as http:
        yield Client(sdk.stack.urls[0], key, retry=FAST_RETRY, http_client=http)


def test_client_errors_are_typed_and_never_retried(sdk: Sdk) -> None:
    sent: list[str] = []
    key = sdk.keys["greeting"]
    with counting_client(sdk, key, sent) as client, counting_client(sdk, "app-wrong", sent) as wrong:
        finished = client.run({"name": "Err"}, "u1", stream=False)
        task_id = finished.task_id
        cases = [
            (AuthenticationError, 401, lambda: list(wrong.follow(task_id, "u1"))),
            (AuthenticationError, 401, lambda: wrong.start({"name": "x"}, "u1")),
            (NotFoundError, 404, lambda: list(client.follow(UNKNOWN, "u1"))),
            (NotFoundError, 404, lambda: list(client.follow(task_id, "intruder"))),
            (NotFoundError, 404, lambda: client.get_run(UNKNOWN, "u1")),
            (NotFoundError, 404, lambda: client.stop("../../x", "u1")),
            (InvalidResumeTokenError, 400, lambda: list(client.follow(task_id, "u1", after="garbage"))),
            (InvalidRequestError, 400, lambda: list(client.run({}, "u1"))),
            (InvalidRequestError, 400, lambda: client.get_run(UNKNOWN, " ")),
            (NotFoundError, 404, lambda: client.submit_human_input(UNKNOWN, "u1", {})),
            (NotFoundError, 404, lambda: client.get_form("no-such-form")),
            (NotFoundError, 404, lambda: client.submit_form("no-such-form", "u1", {}, action="submit")),
            (ConflictError, 409, lambda: client.submit_human_input(finished.workflow_run_id, "u1", {})),
        ]
        for error_type, status, call in cases:
            before = len(sent)
            with pytest.raises(error_type) as raised:
                call()
            assert raised.value.status == status and raised.value.code and raised.value.message
            assert len(sent) - before == 1, f"{error_type.__name__} was retried: {sent[before:]}"
        assert raised.value.code == "workflow_not_paused"


def test_a_server_that_is_not_there_exhausts_the_budget(sdk: Sdk) -> None:
    policy = RetryPolicy(initial_delay=0.01, max_attempts=3)
    with Client(f"http://127.0.0.1:{free_port()}", sdk.keys["greeting"], retry=policy) as client:
        with pytest.raises(ConnectionLostError) as lost:
            list(client.run({"name": "Nobody"}, "u1"))
        assert lost.value.attempts == 3 and lost.value.last_event_id is None  # max_attempts, first try included
        with pytest.raises(ConnectionLostError):
            client.get_run(UNKNOWN, "u1")


def test_typed_events_a_pause_and_a_form_submitted_by_its_token(sdk: Sdk) -> None:
    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        stream = client.run({"name": "Ada", "mood": "formal"}, "u1")
        head = list(stream)
        assert isinstance(head[0], WorkflowStarted) and head[0].inputs["name"] == "Ada"
        assert head[0].reason == "initial"
        paused = head[-1]
        assert isinstance(paused, WorkflowPaused) and paused.paused_nodes == ["approve"] and paused.status == "paused"
        (form,) = [event for event in head if isinstance(event, HumanInputRequired)]
        assert [(f.output_variable_name, f.type) for f in form.inputs] == [
            ("approved", "select"),
            ("note", "paragraph"),
        ]
        assert [action.id for action in form.actions] == ["submit"] and form.node_id == "approve"
        assert form.node_title == "Approve the greeting" and form.form_token and form.expiration_time > time.time()
        (reason,) = paused.reasons
        assert reason.type == "human_input_required" and reason.form_token == form.form_token
        text = "".join(event.text for event in head if isinstance(event, TextChunk))
        assert text == ""  # the formal draft reaches no end node before the pause: none of it streams
        nodes = [event for event in head if isinstance(event, NodeStarted | NodeFinished)]
        assert nodes[0].node_id == "start" and nodes[-1].node_id == "approve"
        run_id = stream.workflow_run_id
        assert run_id is not None and stream.task_id is not None
        assert client.get_run(run_id, "u1").status == "paused"

        shown = client.get_form(form.form_token)
        assert shown.inputs == form.inputs and shown.user_actions == form.actions
        assert shown.expiration_time == form.expiration_time
        client.submit_form(form.form_token, "u1", {"approved": "true"})  # the form's first action
        with pytest.raises(FormSubmittedError) as again:
            client.submit_form(form.form_token, "u1", {"approved": "true"}, action="submit")
        assert again.value.status == 412 and again.value.code == "human_input_form_submitted"

        tail = list(client.follow(run_id, "u1", after=stream.last_event_id))
        assert isinstance(tail[0], WorkflowStarted) and tail[0].reason == "resumption"
        (filled,) = [event for event in tail if isinstance(event, HumanInputFormFilled)]
        assert filled.node_id == "approve" and filled.action_id == "submit"
        assert isinstance(tail[-1], WorkflowFinished) and tail[-1].status == "succeeded"
        greeting = "Hello Ada! It is a wonderful day to build durable streams together."
        assert tail[-1].outputs == {"greeting": f"{greeting} (approved: true)"}
        assert [e.raw for e in head + tail] == sdk.stored_events(run_id)
        detail = client.get_run(run_id, "u1")
        assert detail.status == "succeeded" and detail.is_terminal and detail.outputs == tail[-1].outputs
        assert detail.total_tokens == tail[-1].total_tokens


def test_the_run_id_alias_for_human_input_still_answers(sdk: Sdk) -> None:
    with Client(sdk.stack.urls[1], sdk.keys["greeting"]) as client:
        paused = client.run({"name": "Al", "mood": "formal"}, "u1", stream=False)
        accepted = client.submit_human_input(paused.workflow_run_id, "u1", {"approved": "false"})
        assert accepted.workflow_run_id == paused.workflow_run_id and accepted.task_id == paused.task_id
        events = list(client.follow(paused.workflow_run_id, "u1"))
    assert isinstance(events[-1], WorkflowFinished) and events[-1].status == "succeeded"
    assert [event.raw for event in events] == sdk.stored_events(paused.workflow_run_id)


def test_continue_on_pause_follows_through_the_pause(sdk: Sdk) -> None:
    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        events: list[Event] = []
        stream = client.run({"name": "Bo", "mood": "formal"}, "u1", continue_on_pause=True)
        for event in stream:
            events.append(event)
            if isinstance(event, HumanInputRequired):
                client.submit_form(event.form_token, "u1", {"approved": "false", "note": "no"}, action="submit")
    assert stream.reconnects == 0, "going on after the pause is no reconnect"
    assert isinstance(events[-1], WorkflowFinished) and events[-1].status == "succeeded"
    # The resumed run starts again: a second workflow_started is one more event, not an error.
    assert [e.reason for e in events if isinstance(e, WorkflowStarted)] == ["initial", "resumption"]
    assert stream.workflow_run_id is not None
    assert [e.raw for e in events] == sdk.stored_events(stream.workflow_run_id)


def test_a_first_attach_reads_the_run_from_its_beginning_or_its_tail(sdk: Sdk) -> None:
    sent: list[str] = []
    with counting_client(sdk, sdk.keys["greeting"], sent) as client:
        outcome = client.run({"name": "Attach"}, "u1", stream=False)
        stored = sdk.stored_events(outcome.workflow_run_id)
        del sent[:]
        by_run_id = list(client.follow(outcome.workflow_run_id, "u1"))
        by_task_id = list(client.follow(outcome.task_id, "u1"))
        tail = list(client.follow(outcome.workflow_run_id, "u1", from_start=False))
    assert [event.raw for event in by_run_id] == stored and [event.raw for event in by_task_id] == stored
    # Without a position or a snapshot the server starts at the tail: a finished run is its end.
    (finished,) = tail
    assert isinstance(finished, WorkflowFinished) and finished.outputs == outcome.run.outputs
    assert finished.total_tokens == outcome.run.total_tokens
    assert sent == [
        f"GET /v1/workflow/{outcome.workflow_run_id}/events?user=u1&include_state_snapshot=true",
        f"GET /v1/workflow/{outcome.task_id}/events?user=u1&include_state_snapshot=true",
        f"GET /v1/workflow/{outcome.workflow_run_id}/events?user=u1",
    ]


def test_stop_ends_the_stream_with_a_stopped_run(sdk: Sdk) -> None:
    with Client(sdk.stack.urls[0], sdk.keys["long"]) as client:
        events: list[Event] = []
        stream = client.run({"name": "Stop"}, "u1")
        for event in stream:
            events.append(event)
            if len(events) == 10:
                assert stream.task_id is not None
                client.stop(stream.task_id, "u1")
                client.stop(stream.task_id, "u1")  # idempotent
    assert isinstance(events[-1], WorkflowFinished) and events[-1].status == "stopped"


def test_blocking_and_background_runs(sdk: Sdk) -> None:
    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        outcome = client.run({"name": "Cy"}, "u1", stream=False)
        assert outcome.run.status == "succeeded" and outcome.run.id == outcome.workflow_run_id
        assert outcome.run.total_tokens == client.get_run(outcome.workflow_run_id, "u1").total_tokens
        assert not outcome.replayed
        paused = client.run({"name": "Cy", "mood": "formal"}, "u1", stream=False)
        assert paused.run.status == "paused" and paused.run.finished_at is None
        assert paused.run.paused_nodes == ["approve"] and paused.run.reasons[0].form_token
        client.stop(paused.task_id, "u1")
        assert client.get_run(paused.workflow_run_id, "u1").status == "stopped"
        handle = client.start({"name": "Di"}, "u1")
        events = list(client.follow(handle.workflow_run_id, "u1"))
        assert events[0].event == "workflow_started" and events[-1].raw["data"]["status"] == "succeeded"


def test_the_web_flavour_with_a_site_code_and_a_saved_passport(sdk: Sdk) -> None:
    with WebClient(sdk.stack.urls[0], sdk.site_codes["long"]) as web:
        stream = web.run({"name": "Web"})
        first = next(stream)
        stream.close()
        assert stream.task_id is not None
        # Another process, the same end user: its saved passport sees (and may stop) the run.
        with WebClient(sdk.stack.urls[1], sdk.site_codes["long"], passport=web.passport) as again:
            again.stop(stream.task_id)
            rest = list(again.follow(stream.task_id, after=first.id))
        assert isinstance(rest[-1], WorkflowFinished) and rest[-1].status == "stopped"
        with WebClient(sdk.stack.urls[0], sdk.site_codes["long"]) as stranger, pytest.raises(NotFoundError):
            list(stranger.follow(stream.task_id))
    with WebClient(sdk.stack.urls[0], "no-such-site") as nobody, pytest.raises(NotFoundError) as unknown:
        list(nobody.follow(UNKNOWN))
    assert unknown.value.code == "app_not_found"
    with WebClient(sdk.stack.urls[0], sdk.site_codes["greeting"]) as web:
        assert web.run({"name": "Ed"}, stream=False).run.status == "succeeded"
        paused = web.run({"name": "Ed", "mood": "formal"}, stream=False)
        (reason,) = paused.run.reasons
        assert web.get_form(reason.form_token).user_actions == reason.actions
        with WebClient(sdk.stack.urls[0], sdk.site_codes["greeting"]) as stranger, pytest.raises(NotFoundError):
            stranger.submit_form(reason.form_token, {"approved": "true"}, action="submit")  # another end user's run
        web.submit_form(reason.form_token, {"approved": "true"})
        events = list(web.follow(paused.workflow_run_id))
        assert isinstance(events[-1], WorkflowFinished) and events[-1].status == "succeeded"
