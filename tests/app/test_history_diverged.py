"""Reconnects after the stream store lost a run's last events and the run went on differently (what a
failover to a replica behind leaves): every ``Last-Event-ID`` resumes exactly or is answered 410
``history_diverged`` with the run row; never a 200 that ends without the events or the end.

The store forgets its records through the tests' one hook into the library (the failover suite does
it with real servers, ``tests/durable_stream/test_redis_failover.py``); the reconnects are real
requests to the API, against the run a real Celery worker wrote.
"""

from __future__ import annotations

import json

import pytest

from api.core.app.apps.event_codec import encode_event, stamped, unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED
from api.extensions.ext_durable_stream import durable_stream
from api.models import WorkflowRun
from api.models.engine import db
from harness.hostile_target import FAST_WORKFLOW as FAST
from tests.app.conftest import AppHarness
from tests.app.test_events_sse import events_of, reconnect, run_streaming, stream
from tests.app.test_lost_end import recorded_end
from tests.durable_stream import hooks


@pytest.fixture(scope="module")
def fast_app(harness: AppHarness) -> dict[str, str]:
    return harness.create_app(FAST)


def stored_payloads(name: str) -> list[bytes]:
    with durable_stream().topic(name).subscribe_from_beginning() as subscription:
        payloads = []
        while (record := subscription.receive(timeout=5)) is not CLOSED:
            assert record is not None, "the run's topic did not end"
            payloads.append(record.payload)
    return payloads


# The new history's end (sealed) lies at the first lost position, at the last one (as long as before),
# or beyond both.
@pytest.mark.parametrize("went_on", [0, 1, 3], ids=["sealed_at_a_lost_position", "as_long", "longer"])
def test_every_reconnect_after_a_fork_is_exact_or_410(
    harness: AppHarness, fast_app: dict[str, str], went_on: int
) -> None:
    key = fast_app["api_key"]
    messages = [m for m in run_streaming(harness, key, {"n": "1"}) if not m.is_ping]
    run_id, task_id = messages[0].json["workflow_run_id"], messages[0].json["task_id"]
    name = workflow_run_topic("workflow", run_id)
    lost = 2
    with harness.app.app_context():
        recorded_end(run_id)  # the worker is done with the run's row
        payloads = stored_payloads(name)
        assert len(payloads) == len(messages)
        kept = len(payloads) - lost
        hooks.lose_last_records(durable_stream(), name, lost)
        topic = durable_stream().topic(name)
        # The run went on: other events where the lost ones were, then its end again, sealed.
        others = [
            stamped(encode_event({"event": "text_chunk", "data": {"text": f"other {n}"}})) for n in range(went_on)
        ]
        for payload in [*others, payloads[-1]]:
            topic.append(payload)
        topic.seal()
        # As if the fork had happened while the run was still running: its end, on the new history, is
        # what the row records (an end lost after it was recorded is test_lost_end.py's case).
        info = durable_stream().admin.topic_info(name)
        row = db.session.get(WorkflowRun, run_id)
        assert info is not None and row is not None
        row.stream_final_ordinal, row.stream_final_digest = info.last_ordinal, info.last_digest
        db.session.commit()
    history = [json.loads(unstamped(payload)) for payload in [*payloads[:kept], *others, payloads[-1]]]
    for index, message in enumerate(messages):
        response = reconnect(harness, key, task_id, "u1", last_event_id=message.id)
        if index < kept:
            assert events_of(stream(response)) == history[index + 1 :], f"after event {index}"
        else:
            # This client received an event the store no longer holds: whatever the store holds now is
            # not the continuation of what it saw, even where the new end is exactly at its position.
            assert response.status_code == 410, (index, response.status_code, response.get_data(as_text=True))
            body = response.json
            assert body["code"] == "history_diverged" and "reload" in body["message"]
            assert body["run"]["id"] == run_id and body["run"]["status"] == "succeeded"
