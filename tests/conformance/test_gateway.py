"""The gateway beyond the conformance suite: 410 behind retention and age retention on every adapter,
access scoping, hostile input, a store that stops half-way (503), retries after a write that failed
half-way, and what a request costs in store calls."""

from __future__ import annotations

import json
import pathlib
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from api.configs import AppConfig
from api.core.durable_stream import DurableStreamUnavailableError, connect
from api.durable_streams_app import create_gateway_app
from api.services import app_service
from api.services.durable_streams_gateway import access
from api.services.durable_streams_gateway.errors import GatewayError
from api.services.durable_streams_gateway.metadata import MetadataStore, StreamMeta
from tests.app import examples

from .gateway import ADAPTERS, adapter_store, adapter_url
from .store_calls import StoreCalls

pytestmark = pytest.mark.timeout(60)


def gateway_app(tmp_path: pathlib.Path, stream_url: str, *, anonymous: bool = True, max_age: float = 0) -> Flask:
    config = AppConfig(
        VAR_DIR=tmp_path,
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'app.db'}",
        DURABLE_STREAM_URL=stream_url,
        DURABLE_STREAM_MAX_AGE_SECONDS=max_age,
        DURABLE_STREAMS_GATEWAY_ANONYMOUS=anonymous,
        DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS=1,
    )
    return create_gateway_app(config)


def read_in_thread(app: Flask, url: str, chunks: queue.Queue[bytes | None]) -> threading.Thread:
    """A streaming GET of ``url`` in a thread of its own: each chunk goes to ``chunks``, then ``None``."""

    def read() -> None:
        response = app.test_client().get(url, buffered=False)
        try:
            for chunk in response.response:
                chunks.put(chunk if isinstance(chunk, bytes) else chunk.encode())
        finally:
            chunks.put(None)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.fixture(params=ADAPTERS)
def adapter_client(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[tuple[FlaskClient, str]]:
    with adapter_store(request.param, tmp_path) as url:
        app = gateway_app(tmp_path, url)
        yield app.test_client(), url
        app.extensions["durable_stream"].close()


def test_an_offset_behind_retention_is_410_on_every_adapter(adapter_client: tuple[FlaskClient, str]) -> None:
    client, _url = adapter_client
    path = f"/retention/{uuid.uuid4().hex}"
    assert client.put(path, headers={"Content-Type": "text/plain"}, data="a").status_code == 201
    first = client.get(path).headers["Stream-Next-Offset"]
    for chunk in ("b", "c", "d"):
        assert client.post(path, headers={"Content-Type": "text/plain"}, data=chunk).status_code == 204
    app = client.application
    backend = app.extensions["durable_stream"].backend
    backend.admin.trim_topic(f"ds:{path}", 1)
    # Records 2 and 3 are gone: a reader after record 1 would miss them.
    response = client.get(f"{path}?offset={first}")
    assert response.status_code == 410
    assert client.get(f"{path}?offset={first}&live=long-poll").status_code == 410
    assert client.get(f"{path}?offset={first}&live=sse").status_code == 410
    # From the beginning (-1) is what is retained, and the tail still reads.
    assert client.get(f"{path}?offset=-1").data == b"d"
    tail = client.get(path).headers["Stream-Next-Offset"]
    assert client.get(f"{path}?offset={tail}").status_code == 200
    # An offset of a deleted and re-created stream is refused, not resolved against new data.
    assert client.delete(path).status_code == 204
    assert client.put(path, headers={"Content-Type": "text/plain"}, data="new").status_code == 201
    assert client.get(f"{path}?offset={tail}").status_code == 410


def test_reads_resume_past_one_read_buffer_on_every_adapter(adapter_client: tuple[FlaskClient, str]) -> None:
    client, _url = adapter_client
    path, text = f"/long/{uuid.uuid4().hex}", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text).status_code == 201
    offsets = []
    for number in range(300):  # more than the library's read buffer (128 records)
        response = client.post(path, headers=text, data=f"{number},")
        assert response.status_code == 204
        offsets.append(response.headers["Stream-Next-Offset"])
    response = client.get(f"{path}?offset={offsets[199]}")
    assert response.status_code == 200
    assert response.data == "".join(f"{number}," for number in range(200, 300)).encode()
    long_poll = client.get(f"{path}?offset={offsets[250]}&live=long-poll")
    assert long_poll.status_code == 200 and long_poll.data.startswith(b"251,")


def test_hostile_input_is_refused_without_a_500(tmp_path: pathlib.Path) -> None:
    client = gateway_app(tmp_path, adapter_url("memory", tmp_path)).test_client()
    path = "/hostile/a"
    assert client.put(path, headers={"Content-Type": "application/json"}, data="[1]").status_code == 201
    for offset in ("x", "1_2", "0000000000000001_", "-2", "9" * 40, "0000000000000001_0000000000000000", "%00"):
        assert client.get(f"{path}?offset={offset}").status_code == 400, offset
    assert client.get(f"{path}?offset=0000000000000001_0000000000000001").status_code == 410
    assert client.post(path, headers={"Content-Type": "application/json"}, data="{").status_code == 400
    assert client.post(path, headers={"Content-Type": "application/json"}, data="[" * 5000).status_code == 400
    assert client.post(path, headers={"Content-Type": "text/plain"}, data="x").status_code == 409
    assert client.put("/hostile/../etc", headers={"Content-Type": "text/plain"}).status_code == 400
    assert client.put("/" + "x" * 600, headers={"Content-Type": "text/plain"}).status_code == 400
    headers = {"Content-Type": "application/json", "Producer-Id": "p", "Producer-Epoch": "1e3", "Producer-Seq": "0"}
    assert client.post(path, headers=headers, data="1").status_code == 400
    assert client.put(path, headers={"Content-Type": "text/plain", "Stream-TTL": "-1"}).status_code == 400
    assert client.put("/hostile/b", headers={"Stream-Expires-At": "yesterday"}).status_code == 400
    assert client.put("/hostile/b", headers={"Stream-Expires-At": "9999-12-31T23:59:59.9-23:59"}).status_code == 201
    both = {"Stream-TTL": "1", "Stream-Expires-At": "2099-01-01T00:00:00Z"}
    assert client.put("/hostile/c", headers=both).status_code == 400
    assert client.put("/hostile/c", headers={"Stream-Fork-Sub-Offset": "1"}).status_code == 400
    assert client.put("/hostile/c", headers={"Stream-Forked-From": path, "Stream-Fork-Offset": "x"}).status_code == 400
    for elsewhere in (f"http://evil.example{path}", f"https://localhost:8443{path}", "http://[::1/x"):
        assert client.put("/hostile/c", headers={"Stream-Forked-From": elsewhere}).status_code == 400, elsewhere
    assert client.put("/hostile/c", headers={"Stream-Forked-From": f"http://LOCALHOST{path}"}).status_code == 201
    assert client.get("/hostile/\x01").status_code == 400
    with pytest.raises(GatewayError):  # (no HTTP client sends one: WSGI paths are decoded with replacement)
        access.validate_path("/hostile/\udc80")
    assert client.get("/hostile/missing").status_code == 404
    assert client.open(path, method="PATCH").status_code == 405
    for number in ("NaN", "[1, Infinity]", "1e400"):  # they would reach readers as invalid JSON
        assert client.post(path, headers={"Content-Type": "application/json"}, data=number).status_code == 400, number
    producer = {"Content-Type": "application/json", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert client.post(path, headers={**producer, "Producer-Id": "p" * 300}, data="1").status_code == 400
    long_seq = {"Content-Type": "application/json", "Stream-Seq": "9" * 300}
    assert client.post(path, headers=long_seq, data="1").status_code == 400
    assert client.get(path).data == b"[1]"  # none of it was stored
    quoted = '/hostile/q"x'
    assert client.put(quoted, headers={"Content-Type": "text/plain<script>"}).status_code == 201
    head, read = client.head(quoted), client.get(quoted)
    assert head.headers["ETag"] == read.headers["ETag"] and '"' not in head.headers["ETag"][1:-1]
    assert read.headers["Content-Type"].startswith("application/octet-stream"), read.headers["Content-Type"]


def test_api_keys_scope_streams_and_runs(tmp_path: pathlib.Path) -> None:
    app = gateway_app(tmp_path, adapter_url("sqlite", tmp_path), anonymous=False)
    client = app.test_client()
    definition = examples.greeting()
    with app.app_context():
        one, two = (app_service.create_app(definition) for _ in range(2))
        ids = one.id, two.id
        keys = one.api_key, two.api_key
    key_one = {"Authorization": f"Bearer {keys[0]}"}
    key_two = {"Authorization": f"Bearer {keys[1]}"}
    owned = f"/apps/{ids[0]}/notes"
    # Anonymous access is off: no key is 401 everywhere.
    assert client.put("/open/a", headers={"Content-Type": "text/plain"}).status_code == 401
    assert client.get(owned).status_code == 401
    assert client.get("/runs/00000000-0000-0000-0000-000000000000").status_code == 401
    assert client.get("/open/a", headers={"Authorization": "Bearer nope"}).status_code == 401
    # An app writes, reads and deletes in its own namespace ...
    assert client.put(owned, headers={**key_one, "Content-Type": "text/plain"}, data="x").status_code == 201
    assert client.get(owned, headers=key_one).data == b"x"
    # ... and another app's key reaches none of it.
    assert client.get(owned, headers=key_two).status_code == 403
    assert client.post(owned, headers={**key_two, "Content-Type": "text/plain"}, data="y").status_code == 403
    assert client.delete(owned, headers=key_two).status_code == 403
    assert client.put("/open/b", headers={**key_one, "Content-Type": "text/plain"}).status_code == 403
    # Runs: another app's run (or none) is 404, and runs are read-only.
    assert client.get("/runs/00000000-0000-0000-0000-000000000000", headers=key_one).status_code == 404
    assert client.post("/runs/x", headers={**key_one, "Content-Type": "application/json"}, data="1").status_code == 403
    assert client.delete(owned, headers=key_one).status_code == 204


def test_a_store_that_stops_half_way_is_503(tmp_path: pathlib.Path) -> None:
    from harness.redis_server import RedisServer

    server = RedisServer().start()
    try:
        app = gateway_app(tmp_path, f"{server.url}?socket_timeout=1&socket_connect_timeout=0.5")
        client = app.test_client()
        path = "/outage/a"
        assert client.put(path, headers={"Content-Type": "text/plain"}, data="a").status_code == 201
        server.stop()
        for response in (
            client.get(path),
            client.post(path, headers={"Content-Type": "text/plain"}, data="b"),
            client.head(path),
        ):
            assert response.status_code == 503
            assert response.headers["Retry-After"] == "1"
    finally:
        server.stop()


def test_connect_urls_of_the_adapters_are_valid(tmp_path: pathlib.Path) -> None:
    for adapter in ("memory", "sqlite"):
        connect(adapter_url(adapter, tmp_path)).close()


def test_the_metadata_cache_keeps_the_streams_used_last(tmp_path: pathlib.Path) -> None:
    with connect(adapter_url("memory", tmp_path)) as backend:
        store = MetadataStore(backend, cache_size=2)
        for name in ("a", "b", "c"):
            store.save(f"/{name}", StreamMeta(content_type="text/plain", data_epoch="e", created=0.0, touched=0.0))
        assert store.cached("/a") is None
        assert store.load("/a") is not None  # read again, it evicts the least recently used
        assert store.cached("/b") is None
        assert store.cached("/c") is not None and store.cached("/a") is not None


# Store calls ---------------------------------------------------------------------------------------


def test_an_append_costs_three_store_calls(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = gateway_app(tmp_path, adapter_url("sqlite", tmp_path))
    client = app.test_client()
    plain, ttl = "/calls/plain", "/calls/ttl"
    text = {"Content-Type": "text/plain"}
    assert client.put(plain, headers=text).status_code == 201
    assert client.put(ttl, headers={**text, "Stream-TTL": "3600"}).status_code == 201
    store = StoreCalls(app.extensions["durable_stream"].backend, monkeypatch)
    for path in (plain, ttl):
        for body in ("a", "b", "c"):
            store.calls.clear()
            assert client.post(path, headers=text, data=body).status_code == 204
            # The stream's incarnation and seal, the append, and the tail it reached (Stream-Next-Offset):
            # the metadata comes from this process's cache, and a TTL slides with a snapshot at most
            # every quarter TTL, not one per append.
            assert store.names() == ["topic_info", "append", "topic_info"], (path, body)
    producer = {**text, "Producer-Id": "p", "Producer-Epoch": "0"}
    assert client.post(plain, headers={**producer, "Producer-Seq": "0"}, data="d").status_code == 200
    store.calls.clear()
    assert client.post(plain, headers={**producer, "Producer-Seq": "1"}, data="e").status_code == 200
    assert store.names() == ["topic_info", "topic_info", "append", "topic_info", "append"]
    assert client.get(plain).data == b"abcde"


def test_sse_does_not_ask_for_the_streams_info_after_each_live_record(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = gateway_app(tmp_path, adapter_url("memory", tmp_path))
    client = app.test_client()
    path, text = "/calls/sse", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text, data="0").status_code == 201
    tail = client.head(path).headers["Stream-Next-Offset"]
    store = StoreCalls(app.extensions["durable_stream"].backend, monkeypatch)
    events: queue.Queue[bytes | None] = queue.Queue()
    thread = read_in_thread(app, f"{path}?offset={tail}&live=sse", events)
    received = b""
    for body in ("1", "2", "3", "4", "5"):
        while b"upToDate" not in received.rsplit(b"event: data", 1)[-1]:
            chunk = events.get(timeout=10)
            assert chunk is not None, received
            received += chunk
        received = b""
        assert client.post(path, headers=text, data=body).status_code == 204
    assert client.post(path, headers={**text, "Stream-Closed": "true"}).status_code == 204
    while (chunk := events.get(timeout=10)) is not None:
        received += chunk
    thread.join(timeout=10)
    assert b"data:5" in received and b'"streamClosed":true' in received, received
    assert thread.ident is not None
    calls = store.names(thread.ident)
    # Two for the stream's load, one to confirm the seal; none per live record.
    assert calls.count("topic_info") <= 3, calls


def test_creates_and_deletes_that_stop_half_way_leave_nothing_in_the_way(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = gateway_app(tmp_path, adapter_url("sqlite", tmp_path)).test_client()
    text = {"Content-Type": "text/plain"}
    # A create whose records are written but whose final snapshot is not: the retry replaces them.
    save, saves = MetadataStore.save, []

    def second_save_fails(self: MetadataStore, path: str, meta: Any) -> None:
        saves.append(meta.pending)
        if len(saves) == 2:
            raise DurableStreamUnavailableError("the store went away")
        save(self, path, meta)

    monkeypatch.setattr(MetadataStore, "save", second_save_fails)
    assert client.put("/half/create", headers=text, data="a").status_code == 503
    assert saves == [True, False]
    monkeypatch.undo()
    assert client.get("/half/create").status_code == 404
    assert client.put("/half/create", headers=text, data="a").status_code == 201
    assert client.get("/half/create").data == b"a"
    # A delete that removes the records but not the metadata: the stream is gone, and the path free.
    forget = MetadataStore.forget

    def forget_fails(self: MetadataStore, path: str) -> None:
        monkeypatch.setattr(MetadataStore, "forget", forget)
        raise DurableStreamUnavailableError("the store went away")

    monkeypatch.setattr(MetadataStore, "forget", forget_fails)
    assert client.delete("/half/create").status_code == 503
    assert client.get("/half/create").status_code == 404
    assert client.put("/half/create", headers=text, data="b").status_code == 201
    assert client.get("/half/create").data == b"b"


def test_a_stream_stored_before_framing_reads_and_appends_as_before(tmp_path: pathlib.Path) -> None:
    app = gateway_app(tmp_path, adapter_url("sqlite", tmp_path))
    backend = app.extensions["durable_stream"].backend
    path = "/old/a"
    info = backend.admin.create_topic(f"ds:{path}")
    backend.topic(f"ds:{path}").append(b"raw")
    snapshot = {"v": 1, "content_type": "text/plain", "data_epoch": info.epoch, "created": 1.0, "touched": 1.0}
    backend.topic(f"ds-meta:{path}").append(json.dumps(snapshot).encode())
    client = app.test_client()
    assert client.get(path).data == b"raw"
    producer = {"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert client.post(path, headers=producer, data="+p").status_code == 200
    assert client.post(path, headers={"Content-Type": "text/plain"}, data="+q").status_code == 204
    assert client.get(path).data == b"raw+p+q"
    assert client.post(path, headers=producer, data="+p").status_code == 204


def test_records_without_metadata_are_kept_not_deleted(tmp_path: pathlib.Path) -> None:
    app = gateway_app(tmp_path, adapter_url("sqlite", tmp_path))
    client = app.test_client()
    backend = app.extensions["durable_stream"].backend
    path, text = "/orphan/a", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text, data="precious").status_code == 201
    backend.admin.delete_topic(f"ds-meta:{path}")
    assert client.get(path).status_code == 404
    response = client.put(path, headers=text)
    assert response.status_code == 409, response.data
    assert b"metadata" in response.data
    info = backend.admin.topic_info(f"ds:{path}")
    assert info is not None and info.length == 1
    # A stream whose records are gone (a delete that stopped after them) is created afresh.
    assert client.put("/orphan/b", headers=text, data="x").status_code == 201
    backend.admin.delete_topic("ds:/orphan/b")
    assert client.get("/orphan/b").status_code == 404
    assert client.put("/orphan/b", headers=text, data="y").status_code == 201
    assert client.get("/orphan/b").data == b"y"
    # Metadata no gateway wrote is kept too, and refused rather than a 500.
    for number, junk in enumerate((b"not json", b"[1]", b'{"content_type": "text/plain"}', b'{"producers": []}')):
        backend.topic(f"ds-meta:/orphan/junk{number}").append(junk)
        for response in (client.get(f"/orphan/junk{number}"), client.put(f"/orphan/junk{number}", headers=text)):
            assert response.status_code == 409 and b"ds-meta:" in response.data, (junk, response.status_code)


# Writes that fail half-way ---------------------------------------------------------------------------


def _fail_next_save(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the next metadata save fail (after the record it confirms was appended); count the failures."""
    failed: list[int] = []
    save = MetadataStore.save

    def flaky(self: MetadataStore, path: str, meta: Any) -> None:
        if not failed:
            failed.append(1)
            raise DurableStreamUnavailableError("the store went away")
        save(self, path, meta)

    monkeypatch.setattr(MetadataStore, "save", flaky)
    return failed


def test_a_producer_retry_after_a_write_that_failed_half_way_appends_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = gateway_app(tmp_path, adapter_url("sqlite", tmp_path)).test_client()
    path, text = "/retry/a", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text).status_code == 201
    producer = {**text, "Producer-Id": "p", "Producer-Epoch": "0"}
    # The record is appended, then saving the producer's sequence fails: 503, and the client retries.
    failed = _fail_next_save(monkeypatch)
    assert client.post(path, headers={**producer, "Producer-Seq": "0"}, data="a").status_code == 503
    assert failed
    retry = client.post(path, headers={**producer, "Producer-Seq": "0"}, data="a")
    assert retry.status_code == 204, retry.data
    assert retry.headers["Producer-Seq"] == "0"
    assert client.post(path, headers={**producer, "Producer-Seq": "1"}, data="b").status_code == 200
    assert client.get(path).data == b"ab"
    # The same when another producer's write comes between the failure and the retry.
    monkeypatch.undo()
    _fail_next_save(monkeypatch)
    assert client.post(path, headers={**producer, "Producer-Seq": "2"}, data="c").status_code == 503
    other = {**text, "Producer-Id": "q", "Producer-Epoch": "0", "Producer-Seq": "0"}
    assert client.post(path, headers=other, data="d").status_code == 200
    assert client.post(path, headers={**producer, "Producer-Seq": "2"}, data="c").status_code == 204
    assert client.post(path, headers={**producer, "Producer-Seq": "3"}, data="e").status_code == 200
    assert client.get(path).data == b"abcde"
    # An append that closes the stream: the retry is the idempotent success of the close.
    monkeypatch.undo()
    _fail_next_save(monkeypatch)
    closing = {**producer, "Producer-Seq": "4", "Stream-Closed": "true"}
    assert client.post(path, headers=closing, data="f").status_code == 503
    retry = client.post(path, headers=closing, data="f")
    assert retry.status_code == 204 and retry.headers["Stream-Closed"] == "true", retry.data
    assert client.get(path).data == b"abcdef"


def test_a_stream_seq_retry_after_a_write_that_failed_half_way_appends_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = gateway_app(tmp_path, adapter_url("sqlite", tmp_path)).test_client()
    path, text = "/retry/seq", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text).status_code == 201
    _fail_next_save(monkeypatch)
    assert client.post(path, headers={**text, "Stream-Seq": "001"}, data="a").status_code == 503
    assert client.post(path, headers={**text, "Stream-Seq": "001"}, data="a").status_code == 409
    assert client.post(path, headers={**text, "Stream-Seq": "002"}, data="b").status_code == 204
    assert client.get(path).data == b"ab"


# Streams that expire at once -------------------------------------------------------------------------


def test_a_put_whose_stream_expires_at_once_is_created_and_gone(tmp_path: pathlib.Path) -> None:
    client = gateway_app(tmp_path, adapter_url("sqlite", tmp_path)).test_client()
    text = {"Content-Type": "text/plain"}
    for path, expiry in (
        ("/instant/ttl", {"Stream-TTL": "0"}),
        ("/instant/past", {"Stream-Expires-At": "2000-01-01T00:00:00Z"}),
    ):
        # The protocol's answer to a valid create (its TTL is a non-negative integer, Expires-At any
        # RFC 3339 time): 201, for a stream that has expired by the time anyone reads it.
        for _ in range(2):
            response = client.put(path, headers={**text, **expiry}, data="x")
            assert response.status_code == 201, (path, response.data)
            assert response.headers["Stream-Next-Offset"]
            assert client.get(path).status_code == 404
            assert client.head(path).status_code == 404
    source = "/instant/source"
    assert client.put(source, headers=text, data="s").status_code == 201
    fork = client.put("/instant/fork", headers={**text, "Stream-Forked-From": source, "Stream-TTL": "0"})
    assert fork.status_code == 201, fork.data
    assert client.get("/instant/fork").status_code == 404
    # The expired fork is no fork any more: deleting the source deletes it (no soft delete, 410).
    assert client.delete(source).status_code == 204
    assert client.get(source).status_code == 404
