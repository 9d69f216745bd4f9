"""The embedded profile's filesystem broker: kombu's read race reproduced, and our transport without it."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import threading
from collections.abc import Callable, Iterator
from queue import Empty
from typing import Any

import kombu
import pytest
from kombu.transport import filesystem as stock

from api.extensions import filesystem_broker


def options(folder: pathlib.Path) -> dict[str, Any]:
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
    }


@pytest.fixture
def channels(tmp_path: pathlib.Path) -> Iterator[Callable[[type], Any]]:
    """Channels of a transport class on one broker folder (each its own connection, as processes have)."""
    connections: list[kombu.Connection] = []

    def channel(transport: type) -> Any:
        connection = kombu.Connection(transport=transport, transport_options=options(tmp_path / "broker"))
        connections.append(connection)
        return connection.channel()

    yield channel
    for connection in connections:
        connection.release()


def test_kombus_transport_loses_a_message_read_while_it_is_written(
    channels: Callable[[type], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, consumer = channels(stock.Transport), channels(stock.Transport)
    seen: list[BaseException] = []
    real_lock = stock.lock

    def lock_then_let_a_consumer_look(file: Any, flags: int) -> None:
        real_lock(file, flags)
        if file.mode == "wb":  # the producer's new, still empty file: a consumer lists the folder now
            try:
                consumer._get("q")
            except BaseException as exc:  # (whatever kombu raises is what the test shows)
                seen.append(exc)

    monkeypatch.setattr(stock, "lock", lock_then_let_a_consumer_look)
    producer._put("q", {"body": "the answer"})
    assert seen and isinstance(seen[0], ValueError), "the consumer read the empty file and failed on it"
    with pytest.raises(Empty):
        consumer._get("q")  # and the message is gone


def test_our_transport_never_shows_a_message_before_it_is_whole(
    channels: Callable[[type], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, consumer = channels(filesystem_broker.Transport), channels(filesystem_broker.Transport)
    looked: list[str] = []
    real_replace = os.replace

    def publish_after_a_consumer_looks(source: Any, target: Any) -> None:
        if str(source).endswith(".tmp"):  # written and synced, not yet published
            try:
                consumer._get("q")
                looked.append("got a message")
            except Empty:
                looked.append("empty")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", publish_after_a_consumer_looks)
    producer._put("q", {"body": "the answer"})
    monkeypatch.setattr(os, "replace", real_replace)
    assert looked == ["empty"]
    assert consumer._get("q") == {"body": "the answer"}
    with pytest.raises(Empty):
        consumer._get("q")


def test_many_producers_and_consumers_move_every_message_exactly_once(channels: Callable[[type], Any]) -> None:
    producers = [channels(filesystem_broker.Transport) for _ in range(3)]
    consumers = [channels(filesystem_broker.Transport) for _ in range(3)]
    per_producer = 300
    done = threading.Event()

    def produce(index: int) -> None:
        for number in range(per_producer):
            producers[index]._put("q", {"id": f"{index}-{number}"})

    def consume(index: int) -> list[str]:
        got: list[str] = []
        while True:
            try:
                got.append(consumers[index]._get("q")["id"])
            except Empty:
                if done.is_set():
                    try:  # one more look after the last publication
                        got.append(consumers[index]._get("q")["id"])
                        continue
                    except Empty:
                        return got
        return got

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        reading = [pool.submit(consume, index) for index in range(3)]
        for writing in [pool.submit(produce, index) for index in range(3)]:
            writing.result(timeout=60)
        done.set()
        received = [item for future in reading for item in future.result(timeout=60)]
    expected = {f"{index}-{number}" for index in range(3) for number in range(per_producer)}
    assert len(received) == len(expected) and set(received) == expected


def test_a_moved_broker_folder_is_created_again_and_a_broken_file_set_aside(
    tmp_path: pathlib.Path, channels: Callable[[type], Any]
) -> None:
    channel = channels(filesystem_broker.Transport)
    channel._put("q", {"body": 1})
    (tmp_path / "broker").rename(tmp_path / "moved")  # an operator moves the folder away
    with pytest.raises(Empty):
        channel._get("q")  # no crash: the folder is there again, empty (the outbox sends what was lost)
    channel._put("q", {"body": 2})
    (tmp_path / "broker" / "queue" / "1_x.q.msg").write_bytes(b"{not json")
    assert channel._get("q") == {"body": 2}
    with pytest.raises(Empty):
        channel._get("q")
    assert [p.name.split(".")[0] for p in (tmp_path / "broker" / "corrupt").iterdir()] == ["1_x"]


def test_the_probe_tells_a_usable_folder_from_an_unusable_one(tmp_path: pathlib.Path) -> None:
    filesystem_broker.probe(tmp_path / "queue")
    assert list((tmp_path / "queue").iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        filesystem_broker.probe(tmp_path / "file" / "queue")


@pytest.mark.timeout(30)
def test_a_wait_for_messages_returns_soon_enough_for_a_shutdown_to_be_seen(tmp_path: pathlib.Path) -> None:
    # Celery's loop for a polled broker asks to wait 2 s and looks for a shutdown only after; here, a
    # minute asked for comes back after DRAIN_WAIT (with nothing: a timeout), or the test's timeout fails it.
    connection = kombu.Connection(transport=filesystem_broker.Transport, transport_options=options(tmp_path / "b"))
    try:
        with connection.Consumer(kombu.Queue("q"), callbacks=[lambda body, message: None]), pytest.raises(TimeoutError):
            connection.drain_events(timeout=60)
    finally:
        connection.release()
