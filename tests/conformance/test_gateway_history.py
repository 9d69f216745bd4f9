"""Gateway offsets name the record they follow: a store that lost it (a failover) answers 410, never
another history as the continuation; and the protocol details the official clients rely on (an offset
past the tail is 400, a 204 has no media type, a run's stream exists as soon as the run is accepted)."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from api.core.app.apps.topics import workflow_run_topic
from api.models import WorkflowRun
from api.models.engine import db
from api.services import app_service
from api.services.durable_streams_gateway.offsets import parse_offset
from tests.app import examples
from tests.durable_stream import hooks

from .gateway import ADAPTERS, adapter_store, adapter_url
from .test_gateway import gateway_app

pytestmark = pytest.mark.timeout(90)

TEXT = {"Content-Type": "text/plain"}


@pytest.fixture(params=ADAPTERS)
def adapter_client(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[FlaskClient]:
    with adapter_store(request.param, tmp_path) as url:
        app = gateway_app(tmp_path, url)
        yield app.test_client()
        app.extensions["durable_stream"].close()


def append(client: FlaskClient, path: str, data: str) -> str:
    response = client.post(path, headers=TEXT, data=data)
    assert response.status_code == 204, response.data
    return str(response.headers["Stream-Next-Offset"])


def sse_status(client: FlaskClient, url: str) -> int:
    """The status an SSE read is answered with (its events are not read)."""
    response = client.get(url, buffered=False)
    try:
        return response.status_code
    finally:
        response.close()


def test_offsets_name_their_record_and_old_offsets_still_read(adapter_client: FlaskClient) -> None:
    client = adapter_client
    path = f"/history/{uuid.uuid4().hex}"
    assert client.put(path, headers=TEXT).status_code == 201
    offsets = [append(client, path, chunk) for chunk in ("a", "b", "c")]
    parsed = [parse_offset(offset) for offset in offsets]
    assert [offset.ordinal for offset in parsed] == [1, 2, 3]
    assert all(len(offset.digest) == 16 for offset in parsed) and len({offset.digest for offset in parsed}) == 3
    assert offsets == sorted(offsets)  # the protocol compares offsets as strings
    # Every read names its end the same way, whichever answer it is.
    assert client.get(f"{path}?offset={offsets[0]}").headers["Stream-Next-Offset"] == offsets[2]
    assert client.head(path).headers["Stream-Next-Offset"] == offsets[2]
    assert client.get(f"{path}?offset={offsets[0]}").data == b"bc"
    # An offset of the previous release (no digest) reads by ordinal, as before.
    old = offsets[0].rsplit("_", 1)[0]
    assert client.get(f"{path}?offset={old}").data == b"bc"


@pytest.mark.parametrize("then", ["shorter", "as_long_sealed", "longer"])
def test_after_a_store_lost_records_every_offset_reads_exactly_or_is_410(
    adapter_client: FlaskClient, then: str
) -> None:
    client = adapter_client
    path = f"/history/{uuid.uuid4().hex}"
    assert client.put(path, headers=TEXT).status_code == 201
    old = ["a", "b", "c", "d", "e"]
    offsets = [append(client, path, chunk) for chunk in old]
    backend = client.application.extensions["durable_stream"].backend
    hooks.lose_last_records(backend, f"ds:{path}", 2)  # d and e are gone: a failover to a replica behind
    new = {"shorter": ["X"], "as_long_sealed": ["X", "Y"], "longer": ["X", "Y", "Z"]}[then]
    for chunk in new:
        append(client, path, chunk)
    if then == "as_long_sealed":
        assert client.post(path, headers={"Stream-Closed": "true"}).status_code == 204
    history = old[:3] + new
    for index, offset in enumerate(offsets):
        ordinal = index + 1
        expected = "".join(history[ordinal:]) if ordinal <= 3 else None
        catch_up = client.get(f"{path}?offset={offset}")
        long_poll = client.get(f"{path}?offset={offset}&live=long-poll")
        if expected is None:
            # A reader who received d (or e) is told: never X, Y, Z as what follows, never an empty end.
            assert catch_up.status_code == 410, (ordinal, catch_up.status_code, catch_up.data)
            assert b"history_diverged" in catch_up.data
            assert long_poll.status_code == 410, (ordinal, long_poll.status_code)
            assert sse_status(client, f"{path}?offset={offset}&live=sse") == 410
        else:
            assert catch_up.status_code == 200 and catch_up.data.decode() == expected, (ordinal, catch_up.data)
            if expected:
                assert long_poll.status_code == 200 and long_poll.data.decode() == expected


def test_an_offset_past_the_tail_is_400_and_a_lost_one_410(tmp_path: pathlib.Path) -> None:
    client = gateway_app(tmp_path, adapter_url("memory", tmp_path)).test_client()
    path = "/past/a"
    assert client.put(path, headers=TEXT, data="a").status_code == 201
    tail = client.head(path).headers["Stream-Next-Offset"]
    ordinal, tag, digest = tail.split("_")
    beyond = f"{int(ordinal) + 5:016d}_{tag}"
    for live in ("", "&live=long-poll", "&live=sse"):
        assert client.get(f"{path}?offset={beyond}{live}").status_code == 400, live
        # The same position with a digest is one the gateway handed out: the store lost what it follows.
        assert client.get(f"{path}?offset={beyond}_{digest}{live}").status_code == 410, live
    # At the tail, another record than the one the offset follows is 410 too (open, then sealed).
    other = f"{ordinal}_{tag}_{'0' * 16}"
    assert client.get(f"{path}?offset={other}&live=long-poll").status_code == 410
    assert client.post(path, headers={"Stream-Closed": "true"}).status_code == 204
    assert client.get(f"{path}?offset={other}&live=long-poll").status_code == 410
    assert client.get(f"{path}?offset={tail}&live=long-poll").status_code == 204


def test_answers_without_a_body_have_no_content_type(tmp_path: pathlib.Path) -> None:
    client = gateway_app(tmp_path, adapter_url("memory", tmp_path)).test_client()
    path = "/empty/a"
    assert client.put(path, headers=TEXT).status_code == 201
    answers = [
        client.post(path, headers=TEXT, data="x"),
        client.get(f"{path}?offset={client.head(path).headers['Stream-Next-Offset']}&live=long-poll"),
        client.options(path),
        client.delete(path),
    ]
    for answer in answers:
        assert answer.status_code == 204, answer.status_code
        assert "Content-Type" not in answer.headers, (answer.request.method, answer.headers)


def test_a_runs_stream_exists_as_soon_as_the_run_is_accepted(tmp_path: pathlib.Path) -> None:
    app = gateway_app(tmp_path, adapter_url("sqlite", tmp_path), anonymous=False)
    client = app.test_client()
    definition = examples.greeting()
    with app.app_context():
        owner = app_service.create_app(definition)
        key = {"Authorization": f"Bearer {owner.api_key}"}
        run = WorkflowRun(app_id=owner.id, end_user="u1")
        db.session.add(run)
        db.session.commit()
        run_id, topic = run.id, workflow_run_topic(owner.mode, run.id)
    # Accepted, not started: no topic yet. A reader that comes at once reads an empty stream and waits.
    first = client.get(f"/runs/{run_id}?offset=-1", headers=key)
    assert first.status_code == 200 and first.data == b"[]"
    waited = client.get(f"/runs/{run_id}?offset={first.headers['Stream-Next-Offset']}&live=long-poll", headers=key)
    assert waited.status_code == 204
    backend = app.extensions["durable_stream"].backend
    info = backend.admin.topic_info(topic)
    assert info is not None and info.length == 0
    # Once the run has ended and its events are gone, there is nothing to wait for: 404.
    backend.admin.delete_topic(topic)
    with app.app_context():
        row = db.session.get(WorkflowRun, run_id)
        assert row is not None
        row.status, row.stream_epoch = "succeeded", info.epoch
        db.session.commit()
    assert client.get(f"/runs/{run_id}?offset=-1", headers=key).status_code == 404
