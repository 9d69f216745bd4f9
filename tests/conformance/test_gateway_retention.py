"""Age retention under the gateway: a stream in use stays, an idle one goes, and a read from the
beginning starts at whatever retention left (it runs on its own clock, on NATS the server's)."""

from __future__ import annotations

import pathlib
import time
import uuid
from typing import Any

import pytest

from api.services.durable_streams_gateway import reading
from api.services.durable_streams_gateway.streams import KEEPALIVE_FRACTION
from api.services.retention import enforce_retention
from harness.waiting import wait_until

from .gateway import ADAPTERS, adapter_store, adapter_url
from .test_gateway import gateway_app

#: The ages the retention test tries, one after the other while the machine stalls it (see the test).
AGES = (2.0, 4.0, 8.0)
# A hang guard: each age takes at most 2.5 ages of use and 6 to age out.
pytestmark = pytest.mark.timeout(60 + sum(8.5 * age for age in AGES))


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_age_retention_keeps_a_stream_in_use(adapter: str, tmp_path: pathlib.Path) -> None:
    # "In use" means accessed more often than a snapshot the gateway keeps young can age out:
    # every max_age * (1 - KEEPALIVE_FRACTION). A machine that stalls the test longer than that between
    # two requests makes that premise false, not the gateway wrong: the test starts again with a longer age.
    for max_age in AGES:
        var_dir = tmp_path / f"age-{max_age:g}"
        var_dir.mkdir()
        with adapter_store(adapter, var_dir) as url:
            if _keeps_a_stream_in_use(url, var_dir, max_age):
                return
    pytest.fail("the machine never let the test access the stream often enough to keep it in use")


def _keeps_a_stream_in_use(url: str, var_dir: pathlib.Path, max_age: float) -> bool:
    """The stream stays while in use and goes when left alone; ``False`` when the test could not keep it in use."""
    app = gateway_app(var_dir, url, max_age=max_age)
    client = app.test_client()
    backend = app.extensions["durable_stream"].backend
    path, text = f"/aged/{uuid.uuid4().hex}", {"Content-Type": "text/plain"}
    in_use = max_age * (1 - KEEPALIVE_FRACTION)
    try:
        previous = time.monotonic()
        assert client.put(path, headers=text, data="a").status_code == 201
        # Written to (and read) for more than twice the age: the sweep the app runs removes old records
        # but never the stream, whose first metadata snapshot is older than the age by then.
        started = time.monotonic()
        while time.monotonic() - started < 2.5 * max_age:
            began = time.monotonic()
            assert client.post(path, headers=text, data="x").status_code == 204
            with app.app_context():
                enforce_retention()
            head, get = client.head(path).status_code, client.get(path).status_code
            # From the start of the previous accesses to the end of these: the longest the stream can
            # have gone untouched. Past "in use", a 404 would be the gateway right.
            if time.monotonic() - previous >= in_use:
                return False
            assert (head, get) == (200, 200)
            previous = began
            time.sleep(max_age / 8)

        # Left alone, the stream goes with its records (both topics), and the path can be used again.
        def gone() -> bool:
            with app.app_context():
                enforce_retention()
            return backend.admin.topic_info(f"ds:{path}") is None and client.head(path).status_code == 404

        wait_until(gone, 6 * max_age, "the idle stream to age out", interval=0.2)
        assert client.put(path, headers=text, data="b").status_code == 201
        assert client.get(path).data == b"b"
        return True
    finally:
        app.extensions["durable_stream"].close()


@pytest.mark.parametrize("read", ["", "?offset=-1", "?offset=-1&live=long-poll"])
def test_a_read_from_the_beginning_starts_at_whatever_retention_left(
    read: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention runs on its own clock (on NATS the server's): the first record may go between the stream's
    info and the read. A read from the beginning then starts at the new first record, never a 410."""
    app = gateway_app(tmp_path, adapter_url("sqlite", tmp_path))
    client = app.test_client()
    backend = app.extensions["durable_stream"].backend
    path, text = f"/trimmed/{uuid.uuid4().hex}", {"Content-Type": "text/plain"}
    assert client.put(path, headers=text, data="a").status_code == 201
    for letter in "bcdef":
        assert client.post(path, headers=text, data=letter).status_code == 204
    keep = [4]
    opened = reading.TopicReader.open

    def open_after_retention(self: reading.TopicReader, after: int, *args: Any, **kwargs: Any) -> Any:
        backend.admin.trim_topic(f"ds:{path}", keep[0])  # retention, between the stream's info and the read
        return opened(self, after, *args, **kwargs)

    monkeypatch.setattr(reading.TopicReader, "open", open_after_retention)
    response = client.get(path + read)
    assert (response.status_code, response.data) == (200, b"cdef")

    # An offset the client holds is another matter: behind what is retained, it is 410.
    behind = response.headers["Stream-Next-Offset"].replace("0000000000000006_", "0000000000000001_", 1)
    assert client.get(f"{path}?offset={behind}").status_code == 410
    # And a stream whose first record goes every time it is read from the beginning is 410 in the end,
    # after a bounded number of attempts.
    attempts = []

    def always_behind(self: reading.TopicReader, after: int, *args: Any, **kwargs: Any) -> Any:
        attempts.append(after)
        backend.admin.trim_topic(f"ds:{path}", max(1, 4 - len(attempts)))
        return opened(self, after, *args, **kwargs)

    monkeypatch.setattr(reading.TopicReader, "open", always_behind)
    assert client.get(path + read).status_code == 410
    assert len(attempts) == 3
    app.extensions["durable_stream"].close()
