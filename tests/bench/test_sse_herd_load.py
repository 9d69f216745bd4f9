"""The herd's clients (``bench/sse_herd_load.py``) against crafted streams: what each start asks for,
how a tail client reconnects, and how its probes are counted (missing, duplicated, skipped on
reconnect, start lag). The app's own delivery is measured by the benchmark, not here: these streams
are scripted so every figure has one right answer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from bench.sse_herd_load import RECORD, Client, Totals

pytestmark = pytest.mark.timeout(30)

#: One stream the peer sends: (probe index, seconds before the request it was "appended"), then it
#: closes, or ends the run when ``finish`` follows.
Stream = list[tuple[int, float] | str]


async def _serve(
    streams: list[Stream], spec: list[Any], asked_at: list[float] | None = None
) -> tuple[dict[str, Any], list[bytes]]:
    """Answer the client's ``len(streams)`` requests with ``streams``; its record and the requests. The
    moment the peer read each request goes to ``asked_at``."""
    requests: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        asked = time.time()
        if asked_at is not None:
            asked_at.append(asked)
        requests.append(head)
        script = streams[len(requests) - 1]
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\nretry: 10\n\n")
        for item in script:
            if item == "finish":
                writer.write(b'id: end\ndata: {"event":"workflow_finished","data":{}}\n\n')
                continue
            assert not isinstance(item, str)
            index, before = item
            stamp = asked - before
            writer.write(
                f'id: e{index}\ndata: {{"event":"text_chunk","data":{{"text":"p{index}@{stamp:.6f}"}}}}\n\n'.encode()
            )
        await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    job = {
        "host": "127.0.0.1",
        "port": port,
        "key": "k",
        "user": "bench",
        "deadline": time.time() + 20,
        "reconnect_ms": 10,
        "jitter_s": 0.0,
        "max_attempts": len(streams) + 1,
    }
    client = Client(job, spec, Totals())
    try:
        await asyncio.wait_for(client.run(), timeout=20)
    finally:
        server.close()
        await server.wait_closed()
    return dict(zip(RECORD, client.record(), strict=True)), requests


def run(
    streams: list[Stream], spec: list[Any], asked_at: list[float] | None = None
) -> tuple[dict[str, Any], list[bytes]]:
    return asyncio.run(_serve(streams, spec, asked_at))


def test_a_tail_client_never_sends_a_cursor_and_counts_skips_apart_from_gaps_and_duplicates() -> None:
    record, requests = run(
        [
            [(3, 0.0), (4, 0.0), (5, 0.0)],  # ends without the run's end
            [(9, 0.0), (10, 0.0), (12, 0.0)],  # 6-8 appended while away: skipped; 11 lost in the stream: missing
            [(11, 0.0), (12, 0.0), (13, 0.0), "finish"],  # a stale start: 11 and 12 again are duplicates
        ],
        [0, "task", time.time(), "tail", None, -1],
    )
    assert len(requests) == 3
    for head in requests:
        assert head.startswith(b"GET /v1/workflow/task/events?user=bench HTTP/1.0\r\n"), head
        assert b"last-event-id" not in head.lower() and b"include_state_snapshot" not in head
    assert record["start"] == "tail"
    assert record["finished"] and record["failure"] == ""
    assert record["resumes"] == 2
    assert record["skipped_on_reconnect"] == 3
    assert (record["missing"], record["out_of_order"], record["duplicated"]) == (1, 1, 2)
    assert (record["first_probe"], record["last_probe"]) == (3, 13)
    assert len(record["start_lags"]) == 3


def test_a_tail_start_lag_is_the_request_time_minus_the_first_probe_stamp() -> None:
    asked_at: list[float] = []
    before = time.time()
    record, _ = run([[(7, 5.0), (8, 0.0), "finish"]], [0, "task", before, "tail", None, -1], asked_at)
    (lag,) = record["start_lags"]
    # Stamped 5 s before the peer read the request, which the client sent between `before` and that read.
    (asked,) = asked_at
    assert 5.0 - (asked - before) <= lag <= 5.0
    assert (record["missing"], record["duplicated"], record["skipped_on_reconnect"]) == (0, 0, 0)


def test_a_cursor_client_resumes_after_its_last_event_and_a_gap_there_is_missing() -> None:
    record, requests = run(
        [[(3, 0.0), (4, 0.0)], [(7, 0.0), "finish"]],
        [0, "task", time.time(), "cursor", "e2", 2],
    )
    assert b"Last-Event-ID: e2\r\n" in requests[0] and b"include_state_snapshot" not in requests[0]
    assert b"Last-Event-ID: e4\r\n" in requests[1]
    assert (record["missing"], record["skipped_on_reconnect"], record["start_lags"]) == (2, 0, [])


def test_a_snapshot_client_replays_from_probe_zero_and_resumes_with_a_cursor() -> None:
    record, requests = run(
        [[(0, 9.0), (1, 8.0)], [(2, 0.0), "finish"]],
        [0, "task", time.time(), "snapshot", None, -1],
    )
    assert b"include_state_snapshot=true" in requests[0] and b"Last-Event-ID" not in requests[0]
    assert b"Last-Event-ID: e1\r\n" in requests[1] and b"include_state_snapshot" not in requests[1]
    assert (record["missing"], record["duplicated"], record["skipped_on_reconnect"]) == (0, 0, 0)
    assert record["finished"]


def test_an_unknown_start_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown start 'head'"):
        Client({"reconnect_ms": 10}, [0, "task", 0.0, "head", None, -1], Totals())
