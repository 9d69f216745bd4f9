"""The gateway beyond the conformance suite: 410 behind retention on every adapter, access scoping,
hostile input, and a store that stops half-way (503)."""

from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator

import pytest
from flask import Flask
from flask.testing import FlaskClient

from api.configs import AppConfig
from api.core.durable_stream import connect
from api.durable_streams_app import create_gateway_app
from api.services import app_service
from harness.processes import ROOT

from .gateway import ADAPTERS, adapter_store, adapter_url

pytestmark = pytest.mark.timeout(60)


def _gateway(tmp_path: pathlib.Path, stream_url: str, *, anonymous: bool = True) -> Flask:
    config = AppConfig(
        VAR_DIR=tmp_path,
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'app.db'}",
        DURABLE_STREAM_URL=stream_url,
        DURABLE_STREAM_MAX_AGE_SECONDS=0,
        DURABLE_STREAMS_GATEWAY_ANONYMOUS=anonymous,
        DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS=1,
    )
    return create_gateway_app(config)


@pytest.fixture(params=ADAPTERS)
def adapter_client(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[tuple[FlaskClient, str]]:
    with adapter_store(request.param, tmp_path) as url:
        app = _gateway(tmp_path, url)
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


def test_hostile_input_is_refused_without_a_500(tmp_path: pathlib.Path) -> None:
    client = _gateway(tmp_path, adapter_url("memory", tmp_path)).test_client()
    path = "/hostile/a"
    assert client.put(path, headers={"Content-Type": "application/json"}, data="[1]").status_code == 201
    for offset in ("x", "1_2", "0000000000000001_", "-2", "9" * 40, "0000000000000001_0000000000000000", "%00"):
        assert client.get(f"{path}?offset={offset}").status_code == 400, offset
    assert client.get(f"{path}?offset=0000000000000001_0000000000000001").status_code == 410
    assert client.post(path, headers={"Content-Type": "application/json"}, data="{").status_code == 400
    assert client.post(path, headers={"Content-Type": "application/json"}, data="[" * 5000).status_code == 400
    assert client.post(path, headers={"Content-Type": "text/plain"}, data="x").status_code == 409
    assert client.put("/hostile/../etc", headers={"Content-Type": "text/plain"}).status_code in (400, 404)
    assert client.put("/" + "x" * 600, headers={"Content-Type": "text/plain"}).status_code == 400
    headers = {"Content-Type": "application/json", "Producer-Id": "p", "Producer-Epoch": "1e3", "Producer-Seq": "0"}
    assert client.post(path, headers=headers, data="1").status_code == 400
    assert client.put(path, headers={"Content-Type": "text/plain", "Stream-TTL": "-1"}).status_code == 400
    assert client.put("/hostile/b", headers={"Stream-Expires-At": "yesterday"}).status_code == 400
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
    app = _gateway(tmp_path, adapter_url("sqlite", tmp_path), anonymous=False)
    client = app.test_client()
    definition = json.loads((ROOT / "examples" / "greeting.json").read_text())
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
        app = _gateway(tmp_path, f"{server.url}?socket_timeout=1&socket_connect_timeout=0.5")
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
