"""One load process of ``python -m bench.sse``: many SSE clients on raw asyncio sockets.

Started as ``python -m bench.sse_load`` with a JSON job on stdin::

    {"host", "port", "key", "user", "task_ids": [...one per client...], "connect_concurrency", "deadline_s"}

Each client sends ``GET /v1/workflow/<task_id>/events?user=…&continue_on_pause=true&include_state_snapshot=true``
as HTTP/1.0 (the body is then the plain SSE text, ended by the server closing the connection;
without ``include_state_snapshot`` the server would start at the run's tail instead of replaying the
run up to its pause), reads the lines and looks only at what it needs: the probe tokens
(``"text":"pN@<stamp>"`` in a ``text_chunk``) and the ``workflow_finished`` that ends the run, after
which it reads on to the server's close. A client costs one socket, one ``StreamReader`` and a few
counters, so a few processes hold thousands of clients without being the bottleneck.

Prints one JSON line when every client has its answer's headers (``{"ready": …}``), and one when all
are done or the deadline passed (``{"done": …}``): counts of answers, order checks, and the
latencies in tenths of a millisecond (receive ``time.time()`` - the producer's stamp), and the delays
from each ``workflow_finished`` to the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import sys
import time
from collections import Counter
from typing import Any

PROBE = re.compile(rb'"text":"p(\d+)@(\d+\.\d+)')


class Totals:
    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.connect_errors = 0
        self.broken = 0  # the connection failed after the headers
        self.unfinished = 0  # EOF or deadline before workflow_finished
        self.finished = 0
        #: From a stream's ``workflow_finished`` to the server closing it, in tenths of a millisecond.
        self.close_delays: list[int] = []
        self.closing = 0  # finished, the close not seen yet
        self.received = 0
        #: Every event (data message) after the run's pause, probes and the resumed run's other events:
        #: what the streaming phase delivers (the replay up to the pause comes before it).
        self.events = 0
        self.missing = 0
        self.duplicated = 0
        self.out_of_order = 0
        self.latencies: list[int] = []
        #: The same latencies by probe index (the first probe of a run is the first event after its resume).
        self.by_probe: dict[int, list[int]] = {}
        self.answered = 0


async def follow(
    job: dict[str, Any], task_id: str, totals: Totals, gate: asyncio.Semaphore, all_answered: asyncio.Event
) -> None:
    request = (
        f"GET /v1/workflow/{task_id}/events?user={job['user']}&continue_on_pause=true&include_state_snapshot=true"
        " HTTP/1.0\r\n"
        f"Host: {job['host']}:{job['port']}\r\nAuthorization: Bearer {job['key']}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    writer = None
    answered = False
    seen = 0  # the stream's events after the run's pause (all of them on a live-only stream)
    try:
        async with gate:
            try:
                reader, writer = await asyncio.open_connection(job["host"], job["port"], limit=1 << 20)
                writer.write(request)
                status_line = await reader.readline()
                status = int(status_line.split()[1]) if status_line.startswith(b"HTTP/") else 0
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
                totals.connect_errors += 1
                return
            totals.statuses[status] += 1
            answered = True
            totals.answered += 1
            if totals.answered == job["clients"]:
                all_answered.set()
        if status != 200:
            return
        expected = 0
        resumed = False
        try:
            while True:
                line = await reader.readline()
                if not line:
                    totals.unfinished += 1
                    return
                if not line.startswith(b"data: "):
                    continue
                # A durable stream replays the run up to its pause first; a live-only (broadcast) one
                # starts with what comes after it.
                seen += 1
                if not resumed and line.startswith(b'data: {"event":"workflow_paused"'):
                    resumed = True
                    seen = 0
                if line.startswith(b'data: {"event":"text_chunk"'):
                    match = PROBE.search(line)
                    if match is None:
                        continue
                    now = time.time()
                    index = int(match[1])
                    if index == expected:
                        expected += 1
                    elif index < expected:
                        totals.duplicated += 1
                        continue
                    else:
                        totals.missing += index - expected
                        totals.out_of_order += 1
                        expected = index + 1
                    totals.received += 1
                    tenths = round((now - float(match[2])) * 10000)
                    totals.latencies.append(tenths)
                    totals.by_probe.setdefault(index, []).append(tenths)
                elif line.startswith(b'data: {"event":"workflow_finished"'):
                    totals.missing += max(0, job["tokens"] - expected)
                    totals.finished += 1
                    finished_at = time.monotonic()
                    totals.closing += 1
                    try:
                        while await reader.read(1 << 16):
                            pass
                    finally:  # still counted as closing if the deadline cancels it
                        if not asyncio.current_task().cancelling():  # type: ignore[union-attr]
                            totals.closing -= 1
                    totals.close_delays.append(round((time.monotonic() - finished_at) * 10000))
                    return
        except OSError:
            totals.broken += 1
    finally:
        totals.events += seen
        if not answered:
            totals.answered += 1
            if totals.answered == job["clients"]:
                all_answered.set()
        if writer is not None:
            writer.close()


async def main_async(job: dict[str, Any]) -> None:
    totals = Totals()
    job["clients"] = len(job["task_ids"])
    gate = asyncio.Semaphore(job.get("connect_concurrency", 64))
    all_answered = asyncio.Event()
    tasks = [asyncio.create_task(follow(job, task_id, totals, gate, all_answered)) for task_id in job["task_ids"]]
    started = time.monotonic()
    deadline = started + job["deadline_s"]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_answered.wait(), timeout=job["deadline_s"])
    print(
        json.dumps(
            {"ready": totals.answered, "ok": totals.statuses[200], "seconds": round(time.monotonic() - started, 2)}
        ),
        flush=True,
    )
    _, pending = await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
    for task in pending:
        task.cancel()
    totals.unfinished += len(pending) - totals.closing
    print(
        json.dumps(
            {
                "done": True,
                "statuses": {str(k): v for k, v in totals.statuses.items()},
                "connect_errors": totals.connect_errors,
                "broken": totals.broken,
                "unfinished": totals.unfinished,
                "unclosed": totals.closing,
                "close_delays": totals.close_delays,
                "finished": totals.finished,
                "received": totals.received,
                "events": totals.events,
                "missing": totals.missing,
                "duplicated": totals.duplicated,
                "out_of_order": totals.out_of_order,
                "latencies": totals.latencies,
                "by_probe": totals.by_probe,
            }
        ),
        flush=True,
    )


def main() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    job = json.loads(sys.stdin.readline())
    asyncio.run(main_async(job))


if __name__ == "__main__":
    main()
