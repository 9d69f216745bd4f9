"""A store that stalls while the gateway is reading and writing: live readers end or answer 503 within
seconds, a write the store took before it stalled is not appended twice by its producer's retry, and
a reader that resumes from the last offset it was given gets the rest exactly once. Records a store
does not deliver in time are 503, never read as missing (an empty read, 404, 410, 409). A PUT that
comes in the middle of a delete waits for it."""

from __future__ import annotations

import pathlib
import queue
import signal
import threading
import time
from typing import Any

import pytest
from flask import Flask

from harness.redis_server import RedisServer
from harness.waiting import wait_until

from .gateway import adapter_url
from .test_gateway import gateway_app, read_in_thread

pytestmark = pytest.mark.timeout(90)

TEXT = {"Content-Type": "text/plain"}


def test_a_store_that_stalls_mid_read_and_mid_write_loses_and_repeats_nothing(tmp_path: pathlib.Path) -> None:
    with RedisServer() as server:
        assert server.process is not None
        app = gateway_app(tmp_path, f"{server.url}?socket_timeout=1&socket_connect_timeout=0.5")
        client = app.test_client()
        path = "/stall/a"
        assert client.put(path, headers=TEXT, data="a").status_code == 201
        chunks: queue.Queue[bytes | None] = queue.Queue()
        reader = read_in_thread(app, f"{path}?offset=-1&live=sse", chunks)
        seen = [b""]
        ended = threading.Event()

        def drained() -> bytes:
            """What the SSE reader got so far (``ended`` is set once its response ended)."""
            while not chunks.empty():
                chunk = chunks.get()
                if chunk is None:
                    ended.set()
                else:
                    seen[0] += chunk
            return seen[0]

        def received(text: bytes) -> bool:
            return text in drained()

        wait_until(lambda: received(b"data:a"), 10, "the SSE reader to get the first record")
        producer = {"Producer-Id": "p1", "Producer-Epoch": "0"}
        assert client.post(path, headers={**TEXT, **producer, "Producer-Seq": "0"}, data="b").status_code == 200
        wait_until(lambda: received(b"data:b"), 10, "the SSE reader to get the live record")
        last_offset = client.head(path).headers["Stream-Next-Offset"]

        server.process.send_signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            # A write the store will carry out once it wakes, answered 503 meanwhile: ambiguous, so retried.
            stalled_write = client.post(path, headers={**TEXT, **producer, "Producer-Seq": "1"}, data="c")
            assert stalled_write.status_code == 503 and stalled_write.headers["Retry-After"]
            poll = client.get(f"{path}?offset={last_offset}&live=long-poll")
            assert poll.status_code == 503 and poll.headers["Retry-After"]
            wait_until(lambda: drained() is not None and ended.is_set(), 15, "the SSE reader to end")
            assert time.monotonic() - began < 20
        finally:
            server.process.send_signal(signal.SIGCONT)
        reader.join(timeout=10)

        def retried() -> int | None:
            status = client.post(path, headers={**TEXT, **producer, "Producer-Seq": "1"}, data="c").status_code
            return status if status != 503 else None

        assert wait_until(retried, 20, "the store to answer again") in (200, 204)
        assert client.post(path, headers={**TEXT, **producer, "Producer-Seq": "2"}, data="d").status_code == 200
        # The SSE reader's last offset (its last control event) resumes exactly after "b".
        control_offsets = [
            line.split(b'"streamNextOffset":"')[1].split(b'"')[0].decode()
            for line in seen[0].split(b"\n")
            if b"streamNextOffset" in line
        ]
        assert control_offsets, seen[0]
        rest = client.get(f"{path}?offset={control_offsets[-1]}")
        assert rest.status_code == 200
        assert rest.data == b"cd", rest.data
        assert client.get(f"{path}?offset=-1").data == b"abcd"
        app.extensions["durable_stream"].close()


class _SilentSubscription:
    """A subscription whose store never delivers: each ``receive`` ends at its timeout with nothing."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __enter__(self) -> _SilentSubscription:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)

    def receive(self, timeout: float | None = None) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _SilentTopic:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def subscribe_from_cursor(self, cursor: Any) -> _SilentSubscription:
        return _SilentSubscription(self._inner.subscribe_from_cursor(cursor))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _silence_reads(app: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = app.extensions["durable_stream"].backend
    topic = backend.topic
    monkeypatch.setattr(backend, "topic", lambda name: _SilentTopic(topic(name)))


def test_records_the_store_does_not_deliver_in_time_are_503_not_missing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = adapter_url("sqlite", tmp_path)
    app = gateway_app(tmp_path, url)
    client = app.test_client()
    path = "/silent/a"
    assert client.put(path, headers=TEXT, data="a").status_code == 201
    first = client.post(path, headers=TEXT, data="b").headers["Stream-Next-Offset"]
    assert client.post(path, headers=TEXT, data="c").status_code == 204
    _silence_reads(app, monkeypatch)
    # Records the stream has but the store does not hand over: not an empty 200 (the client would ask
    # again at once), and a fork of them not a 410 (the fork point is retained).
    for response in (
        client.get(f"{path}?offset=-1"),
        client.get(f"{path}?offset={first}&live=long-poll"),
        client.put("/silent/fork", headers={**TEXT, "Stream-Forked-From": path}),
        client.put(
            "/silent/sub",
            headers={
                **TEXT,
                "Stream-Forked-From": path,
                "Stream-Fork-Offset": "0" * 16 + "_" + "0" * 16,
                "Stream-Fork-Sub-Offset": "1",
            },
        ),
    ):
        assert response.status_code == 503, (response.status_code, response.data)
        assert response.headers["Retry-After"] == "1"
    # A process that has not read the stream's metadata yet: the stream is not "not found" (404), nor
    # may a PUT take its records for an orphan's (409).
    other = gateway_app(tmp_path, url)
    _silence_reads(other, monkeypatch)
    for response in (other.test_client().get(path), other.test_client().put(path, headers=TEXT)):
        assert response.status_code == 503, (response.status_code, response.data)
    monkeypatch.undo()
    assert client.get(path).data == b"abc"
    assert client.put("/silent/fork", headers={**TEXT, "Stream-Forked-From": path}).status_code == 201
    assert client.get("/silent/fork").data == b"abc"
    assert other.test_client().get(path).data == b"abc"
    for each in (app, other):
        each.extensions["durable_stream"].close()


def test_a_put_during_a_delete_waits_for_it(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = gateway_app(tmp_path, adapter_url("sqlite", tmp_path))
    client, admin = app.test_client(), app.extensions["durable_stream"].backend.admin
    path, text = "/race/a", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text, data="old").status_code == 201
    delete_topic, statuses, racers = admin.delete_topic, [], []

    def put_in_between(name: str) -> None:
        delete_topic(name)
        if name == f"ds:{path}" and not racers:  # the records are gone, the metadata not yet
            put = app.test_client().put
            racer = threading.Thread(target=lambda: statuses.append(put(path, headers=text, data="new").status_code))
            racers.append(racer)
            racer.start()
            racer.join(timeout=1)  # it waits for the delete's lock (without it, it would complete here)

    monkeypatch.setattr(admin, "delete_topic", put_in_between)
    assert client.delete(path).status_code == 204
    racers[0].join(timeout=10)
    monkeypatch.undo()
    # The PUT came after the delete: a new stream, not records whose metadata the delete then removed.
    assert statuses == [201]
    assert client.get(path).data == b"new"
