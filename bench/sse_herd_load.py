"""One load process of ``python -m bench.sse --scenario herd|deploy``: open-loop SSE clients that resume.

Started as ``python -m bench.sse_herd_load`` with a JSON job on stdin::

    {"host", "port", "key", "user", "deadline" (time.time()), "reconnect_ms", "jitter_s", "max_attempts",
     "clients": [[index, task_id, start_at (time.time()), start, cursor id or null, cursor probe index], ...]}

Each client starts at its own ``start_at`` whatever the others or the server do (open loop), and
sends ``GET /v1/workflow/<task_id>/events?user=…`` as HTTP/1.0 on a raw asyncio socket. How it asks
depends on its ``start`` (``bench/sse_starts.py``):

- ``cursor``: with ``Last-Event-ID: <cursor>`` (it gets what comes after that event);
- ``snapshot``: with ``include_state_snapshot=true`` (it replays the run from its start);
- ``tail``: with neither (Dify's default reader: it gets what the run appends from then on).

Then:

- **503** (with ``Retry-After``): it waits that many seconds (1 if absent) plus up to ``jitter_s`` at
  random and tries again; counted as ``refused``. Any other non-200 answer fails the client. A
  connection that fails before the headers is retried after the reconnection time, at most
  ``max_attempts`` times in all.
- A stream that ends (EOF or a broken connection) **without** ``workflow_finished`` is reconnected
  (SSE's reconnection: after the last ``retry:`` the server sent, else ``reconnect_ms``, plus up to
  ``jitter_s``); counted as a resume. A ``cursor`` or ``snapshot`` client resumes with
  ``Last-Event-ID`` of the last event received (a ``snapshot`` client that received nothing asks as
  at first); a ``tail`` client asks exactly as at first, **without** a cursor, as Dify's web front end
  does (in the herd and the deploy alike).
- **Exactly once**, for ``cursor`` and ``snapshot`` clients, across all of a client's streams: the
  probe tokens (``pN@<stamp>`` in ``text_chunk`` events) must arrive as consecutive indexes from the
  one after its cursor (0 for a snapshot): a lower index is a duplicate (``duplicated`` += 1), a
  higher one a gap (``missing`` += the gap, ``out_of_order`` += 1). Every run event (``data:`` of a
  message without ``event:``) is counted, so the orchestrator can compare the count with the stored
  run (for these two kinds only: a tail client's starting point is wherever the run was).
- **Exactly once for ``tail`` clients**: within one stream, the probes must be consecutive from the
  stream's **first** probe (gaps are ``missing``, a lower index ``duplicated``, as above). A reconnect
  legitimately skips what was appended while the client was away: when a later stream's first probe
  is higher than the one after the last probe received, the difference is ``skipped_on_reconnect``,
  never ``missing``; when it is lower than or equal to a probe already received, it is ``duplicated``
  (no stale replay), and so is every probe of that stream until it passes the last one received.
- **Start lag** (``tail`` clients), per stream that received a probe: the ``time.time()`` at which
  that stream's request was sent minus the producer stamp of the first probe received on it
  (positive: the stream began with an event appended before the client asked). The orchestrator
  counts a lag over one probe interval as a **stale start**: the tail reader was handed the past.
- **Level with the live tail.** A client is level at a moment when it holds every event the run had
  appended by then. Judged at probe granularity from the producer's stamps: with ``c`` the moment of
  the client's last probe receipt (or the moment its current stream's headers arrived, if it has
  received no probe on that stream yet), the client was level at ``c`` when the next probe it
  receives was stamped (appended) after ``c``: nothing was appended between what it held and ``c``.
  **time to level** = that ``c`` - the client's first attempt (so Retry-After waits and replay count);
  after a resumed stream, **time to level again** = the new ``c`` - the moment the old stream ended.
  The append → client latencies (receipt ``time.time()`` - the probe's stamp) are kept only for
  probes received while level; a stream's end makes the client not level until it is again.

Prints ``{"progress": …}`` once a second (clients level, finished, failed) and at the end one
``{"done": …}`` line: one record per client (see :data:`RECORD`), the latencies while level in
tenths of a millisecond, the run events received per wall-clock second, and named notices seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import resource
import sys
import time
from collections import Counter
from typing import Any

PROBE = re.compile(rb'"text":"p(\d+)@(\d+\.\d+)')
TEXT_CHUNK = b'data: {"event":"text_chunk"'
FINISHED = b'data: {"event":"workflow_finished"'
CODE = re.compile(rb'"code":\s*"([^"]+)"')

#: The fields of a client's record, in order.
RECORD = (
    "index",
    "start",  # tail | cursor | snapshot
    "outcome",  # served | refused_served | failed
    "refused",  # 503 answers (each followed by a wait and a retry)
    "connect_errors",  # connections that failed before the headers (each retried)
    "resumes",  # streams that ended without workflow_finished, reconnected
    "time_to_level",  # seconds from the first attempt to level (None: never)
    "missing",
    "duplicated",
    "out_of_order",
    "skipped_on_reconnect",  # tail: probes appended while it was away (not missing)
    "start_lags",  # tail: per stream with a probe, request sent - first probe's stamp (s)
    "events",  # run events received over all streams
    "first_probe",
    "last_probe",
    "finished",  # workflow_finished received
    "failure",  # why it failed ("" if it did not)
    "ends",  # [[stream end time.time(), seconds to level again or None], ...]
    "statuses",  # every answer's status, in order
    "answer_waits",  # per request, seconds from sending it to its status line
)


class Totals:
    def __init__(self) -> None:
        self.latencies: list[int] = []
        self.events_by_second: Counter[int] = Counter()
        self.notices: Counter[str] = Counter()
        #: The ``code`` of each 503 answer's body.
        self.refusals: Counter[str] = Counter()
        self.records: list[list[Any]] = []
        self.level = 0
        self.finished = 0
        self.failed = 0
        self.started = 0


class Client:
    """One client's state over all its streams."""

    def __init__(self, job: dict[str, Any], spec: list[Any], totals: Totals) -> None:
        self.job = job
        self.index, self.task_id, self.start_at, self.start, self.cursor, cursor_probe = spec
        if self.start not in ("tail", "cursor", "snapshot"):
            raise ValueError(f"client {self.index}: unknown start {self.start!r}")
        self.tail = self.start == "tail"
        self.totals = totals
        self.last_id: bytes | None = self.cursor.encode() if self.cursor else None
        #: The probe index due next; a tail client has none until its first probe.
        self.expected: int | None = None if self.tail else int(cursor_probe) + 1
        self.retry_ms = float(job["reconnect_ms"])
        self.refused = 0
        self.connect_errors = 0
        self.resumes = 0
        self.missing = 0
        self.duplicated = 0
        self.out_of_order = 0
        self.skipped_on_reconnect = 0
        self.start_lags: list[float] = []
        #: When the current attempt's request was sent, and whether its stream has had a probe yet.
        self.sent_at = 0.0
        self.stream_has_probe = False
        self.events = 0
        self.first_probe: int | None = None
        self.last_probe: int | None = None
        self.finished = False
        self.failure = ""
        self.statuses: list[int] = []
        self.answer_waits: list[float] = []
        self.ends: list[list[Any]] = []
        self.first_attempt = 0.0
        self.level = False
        self.ever_level = False
        self.time_to_level: float | None = None
        #: The last moment the client could have been level (see the module's docstring).
        self.candidate = 0.0
        self.served = False

    def request(self) -> bytes:
        job = self.job
        # A tail client keeps no cursor, as Dify's web front end: every stream asks for the live tail.
        cursor = None if self.tail else self.last_id
        query = f"user={job['user']}"
        if not self.tail and cursor is None:
            query += "&include_state_snapshot=true"
        head = (
            f"GET /v1/workflow/{self.task_id}/events?{query} HTTP/1.0\r\n"
            f"Host: {job['host']}:{job['port']}\r\nAuthorization: Bearer {job['key']}\r\n"
            "Accept: text/event-stream\r\n"
        ).encode()
        if cursor is not None:
            head += b"Last-Event-ID: " + cursor + b"\r\n"
        return head + b"\r\n"

    async def wait_reconnect(self) -> None:
        await asyncio.sleep(self.retry_ms / 1000 + random.uniform(0, self.job["jitter_s"]))

    async def run(self) -> None:
        job = self.job
        await asyncio.sleep(max(0.0, self.start_at - time.time()))
        self.first_attempt = time.time()
        self.totals.started += 1
        attempts = 0
        while True:
            if time.time() >= job["deadline"]:
                if not self.served:
                    self.failure = "deadline before an answer"
                return
            attempts += 1
            if attempts > job["max_attempts"]:
                self.failure = f"{attempts - 1} attempts"
                return
            writer = None
            try:
                try:
                    reader, writer = await asyncio.open_connection(job["host"], job["port"], limit=1 << 22)
                    self.sent_at = time.time()
                    writer.write(self.request())
                    status_line = await reader.readline()
                    self.answer_waits.append(round(time.time() - self.sent_at, 4))
                    if not status_line:  # closed before an answer (a worker stopping): a network error
                        raise ConnectionResetError("closed before the status line")
                    status = int(status_line.split()[1]) if status_line.startswith(b"HTTP/") else 0
                    retry_after = 1.0
                    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                        if line.lower().startswith(b"retry-after:"):
                            with contextlib.suppress(ValueError):
                                retry_after = float(line.split(b":", 1)[1].strip())
                except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
                    self.connect_errors += 1
                    await self.wait_reconnect()
                    continue
                self.statuses.append(status)
                if status == 503:
                    self.refused += 1
                    with contextlib.suppress(OSError, TimeoutError):
                        body = await asyncio.wait_for(reader.read(2048), timeout=5)
                        code = CODE.search(body)
                        self.totals.refusals[code[1].decode() if code else "?"] += 1
                    await asyncio.sleep(retry_after + random.uniform(0, job["jitter_s"]))
                    continue
                if status != 200:
                    self.failure = f"HTTP {status}"
                    return
                self.served = True
                self.stream_has_probe = False
                if not self.level:
                    self.candidate = time.time()
                try:
                    if await self.read(reader):
                        self.finished = True
                        return
                except OSError:
                    pass
            finally:
                if writer is not None:
                    writer.close()
            # The stream ended without the run's end: resume after its last event.
            self.resumes += 1
            if self.level:
                self.level = False
                self.totals.level -= 1
            self.ends.append([round(time.time(), 4), None])
            if self.start == "snapshot" and self.last_id is None:  # nothing received: start over as at first
                self.expected, self.events = 0, 0
            await self.wait_reconnect()

    async def read(self, reader: asyncio.StreamReader) -> bool:
        """One stream's messages; True when ``workflow_finished`` came."""
        totals = self.totals
        named = False  # the current message has an ``event:`` field (a ping or a notice, not a run event)
        pending_id: bytes | None = None
        while True:
            line = await reader.readline()
            if not line:
                return False
            if line == b"\n":
                named, pending_id = False, None
                continue
            if line.startswith(b"data: "):
                if named:
                    continue
                now = time.time()
                self.events += 1
                totals.events_by_second[int(now)] += 1
                if pending_id is not None:
                    self.last_id = pending_id
                if line.startswith(TEXT_CHUNK):
                    match = PROBE.search(line)
                    if match is not None:
                        self.probe(int(match[1]), float(match[2]), now)
                elif line.startswith(FINISHED):
                    return True
            elif line.startswith(b"id: "):
                pending_id = line[4:].rstrip(b"\r\n")
            elif line.startswith(b"event: "):
                named = True
                name = line[7:].strip().decode(errors="replace")
                if name != "ping":
                    totals.notices[name] += 1
            elif line.startswith(b"retry: "):
                with contextlib.suppress(ValueError):
                    self.retry_ms = float(line[7:].strip())

    def probe(self, index: int, stamp: float, now: float) -> None:
        if not self.stream_has_probe:
            self.stream_has_probe = True
            if self.tail:
                self.start_lags.append(round(self.sent_at - stamp, 4))
                # A tail stream starts wherever the run is: what was appended while the client was
                # away is skipped, not missing; anything at or below what it holds is a duplicate.
                if self.expected is None or index > self.expected:
                    if self.expected is not None:
                        self.skipped_on_reconnect += index - self.expected
                    self.expected = index
        assert self.expected is not None  # set above for a tail client's first probe
        if index == self.expected:
            self.expected += 1
        elif index < self.expected:
            self.duplicated += 1
            return
        else:
            self.missing += index - self.expected
            self.out_of_order += 1
            self.expected = index + 1
        if self.first_probe is None:
            self.first_probe = index
        self.last_probe = index
        if not self.level and stamp > self.candidate:
            self.level = True
            self.totals.level += 1
            if not self.ever_level:
                self.ever_level = True
                self.time_to_level = round(self.candidate - self.first_attempt, 4)
            if self.ends and self.ends[-1][1] is None:
                self.ends[-1][1] = round(self.candidate - self.ends[-1][0], 4)
        if self.level:
            self.totals.latencies.append(round((now - stamp) * 10000))
        self.candidate = now

    def record(self) -> list[Any]:
        if self.failure or not self.served:
            outcome = "failed"
        elif self.refused:
            outcome = "refused_served"
        else:
            outcome = "served"
        values = {
            "index": self.index,
            "start": self.start,
            "outcome": outcome,
            "refused": self.refused,
            "connect_errors": self.connect_errors,
            "resumes": self.resumes,
            "time_to_level": self.time_to_level,
            "missing": self.missing,
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "skipped_on_reconnect": self.skipped_on_reconnect,
            "start_lags": self.start_lags,
            "events": self.events,
            "first_probe": self.first_probe,
            "last_probe": self.last_probe,
            "finished": self.finished,
            "failure": self.failure or ("" if self.finished else "unfinished"),
            "ends": self.ends,
            "statuses": self.statuses,
            "answer_waits": self.answer_waits,
        }
        return [values[name] for name in RECORD]


async def progress(totals: Totals, stop: asyncio.Event) -> None:
    while not stop.is_set():
        print(
            json.dumps(
                {
                    "progress": {
                        "started": totals.started,
                        "level": totals.level,
                        "finished": totals.finished,
                        "failed": totals.failed,
                    }
                }
            ),
            flush=True,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)


async def main_async(job: dict[str, Any]) -> None:
    totals = Totals()
    clients = [Client(job, spec, totals) for spec in job["clients"]]

    async def one(client: Client) -> None:
        try:
            await client.run()
        finally:
            if client.finished:
                totals.finished += 1
            elif client.failure:
                totals.failed += 1

    stop = asyncio.Event()
    reporter = asyncio.create_task(progress(totals, stop))
    tasks = [asyncio.create_task(one(client)) for client in clients]
    _, pending = await asyncio.wait(tasks, timeout=max(1.0, job["deadline"] - time.time()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    stop.set()
    await reporter
    print(
        json.dumps(
            {
                "done": True,
                "records": [client.record() for client in clients],
                "latencies": totals.latencies,
                "events_by_second": {str(second): count for second, count in totals.events_by_second.items()},
                "notices": dict(totals.notices),
                "refusals": dict(totals.refusals),
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
