"""The app's metrics, counted in plain integers where they happen and published elsewhere.

Counting code (the SSE edge, the run store, the reaper, the durable-stream observer) only adds to
the tallies below: a dict update, no lock, no system call, no ``prometheus_client`` import. A
publisher (``api.extensions.ext_metrics``) turns what was added since its last look into Prometheus
metrics every ``METRICS_FLUSH_INTERVAL`` seconds. Under gevent nothing can interleave with an
update; under a thread pool two threads adding to the same label at the same instant may lose one
of the additions, which a rate over minutes does not notice and which no path here pays a lock to
prevent.

:data:`METRICS` declares every metric the app exports (name, kind, labels, help, buckets): the
publisher builds the Prometheus objects from it and the dashboard test checks queries against it.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import time
from collections.abc import Sequence
from typing import Literal

__all__ = [
    "LAG",
    "METRICS",
    "Metric",
    "StreamMetrics",
    "Tally",
    "enable",
    "enabled",
    "exported_names",
    "observe_lag",
    "observe_replay",
]

Kind = Literal["counter", "gauge", "histogram"]

#: Seconds, from a worker's append to the API's write of the event to a client's socket.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RECORD_BUCKETS = (0.0, 1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0)
#: Seconds back a replay starts: from moments to the default retention of a week.
REPLAY_AGE_BUCKETS = (1.0, 10.0, 60.0, 600.0, 3600.0, 21600.0, 86400.0, 604800.0)


class Tally:
    """Values per label tuple, only ever added to (a gauge's additions may be negative).

    A counter or gauge keeps one number per labels; a histogram keeps its bucket counts (one per
    bound, then +Inf, not cumulative, as ``prometheus_client`` keeps them) followed by the sum.
    """

    __slots__ = ("bounds", "values")

    def __init__(self, bounds: Sequence[float] = ()) -> None:
        self.bounds = tuple(bounds)
        self.values: dict[tuple[str, ...], list[float]] = {}

    def add(self, labels: tuple[str, ...], amount: float = 1) -> None:
        slot = self.values.get(labels)
        if slot is None:
            slot = self.values[labels] = [0.0]
        slot[0] += amount

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        slot = self.values.get(labels)
        if slot is None:
            slot = self.values[labels] = [0.0] * (len(self.bounds) + 2)
        slot[bisect.bisect_left(self.bounds, value)] += 1
        slot[-1] += value

    def snapshot(self) -> dict[tuple[str, ...], list[float]]:
        return {labels: list(slot) for labels, slot in list(self.values.items())}

    def reset(self) -> None:
        self.values = {}


#: The processes that export a metric: the API's (gunicorn workers) and the Celery workers'.
API, WORKER = "api", "worker"
BOTH = frozenset({API, WORKER})
#: In a metric's known label values: the process's own stream-store adapter (``sqlite``, ``redis``, …).
BACKEND = "$backend"


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    #: Which roles export it (each process only its own role's).
    roles: frozenset[str] = BOTH
    #: Label values exported from the start, at 0, so that a dashboard shows 0 rather than no data.
    known: tuple[tuple[str, ...], ...] = ()
    tally: Tally = dataclasses.field(default_factory=Tally, compare=False)

    def __post_init__(self) -> None:
        if self.kind == "histogram":
            object.__setattr__(self, "tally", Tally(self.buckets))


def _metric(
    name: str,
    kind: Kind,
    help: str,
    *labels: str,
    buckets: tuple[float, ...] = (),
    roles: frozenset[str] = BOTH,
    known: tuple[tuple[str, ...], ...] = (),
) -> Metric:
    return Metric(name, kind, help, labels, buckets, roles, known)


def _each(*values: str) -> tuple[tuple[str, ...], ...]:
    return tuple((value,) for value in values)


def _per_backend(*values: str) -> tuple[tuple[str, ...], ...]:
    return tuple((BACKEND, value) for value in values) if values else ((BACKEND,),)


#: What a request for a run's events can come to (``workflow_sse_resumes_total``).
RESUME_OUTCOMES = (
    "attached",
    "resumed",
    "invalid_resume_token",
    "resume_cursor_expired",
    "history_diverged",
    "run_events_lost",
    "not_found",
    "unavailable",
)
TRANSPORTS = ("durable_stream", "broadcast_channel")


# The library's own activity, per backend (adapter) — fed by StreamMetrics, the durable-stream observer.
APPENDS = _metric(
    "durable_stream_appends_total",
    "counter",
    "Appends by outcome.",
    "backend",
    "outcome",
    known=_per_backend("ok", "sealed", "unavailable"),
)
APPEND_SECONDS = _metric(
    "durable_stream_append_seconds",
    "histogram",
    "Append latency.",
    "backend",
    buckets=LATENCY_BUCKETS,
    known=_per_backend(),
)
RECORDS_READ = _metric(
    "durable_stream_records_read_total", "counter", "Records read by subscriptions.", "backend", known=_per_backend()
)
SUBSCRIPTIONS_OPEN = _metric(
    "durable_stream_subscriptions_open", "gauge", "Subscriptions open.", "backend", known=_per_backend()
)
BACKLOG = _metric(
    "durable_stream_subscription_backlog_records",
    "histogram",
    "Retained records after a subscription's start when it began (what it replays), by start.",
    "backend",
    "start",
    buckets=RECORD_BUCKETS,
    known=_per_backend("cursor", "beginning", "tail"),
)
CURSOR_UNAVAILABLE = _metric(
    "durable_stream_cursor_unavailable_total",
    "counter",
    "CursorUnavailableError by reason.",
    "backend",
    "reason",
    roles=frozenset({API}),
    known=_per_backend("trimmed", "epoch", "history_diverged", "foreign", "malformed", "unknown"),
)
UNAVAILABLE = _metric(
    "durable_stream_unavailable_total",
    "counter",
    "DurableStreamUnavailableError (the store failed).",
    "backend",
    known=_per_backend(),
)
# The app's.
STREAMS_OPEN = _metric(
    "workflow_sse_streams_open",
    "gauge",
    "SSE event streams open.",
    "transport",
    roles=frozenset({API}),
    known=_each(*TRANSPORTS),
)
WRITERS_OPEN = _metric(
    "workflow_sse_writers_open",
    "gauge",
    "Shared SSE writers (one per run that clients follow live, per API process).",
    roles=frozenset({API}),
)
HANDBACKS = _metric(
    "workflow_sse_handbacks_total",
    "counter",
    "Clients a shared writer handed back to their own stream: slow (its socket buffer was full) or failed "
    "(the writer's read of the run's events failed).",
    "reason",
    roles=frozenset({API}),
    known=_each("slow", "failed"),
)
ADMISSION_REFUSED = _metric(
    "workflow_sse_admission_refused_total",
    "counter",
    "Event streams an API process refused before any work (503 server_busy): too many starting at once, or "
    "its event loop behind (loop_lag).",
    "reason",
    roles=frozenset({API}),
    known=_each("starting", "loop_lag"),
)
ARRIVALS = _metric(
    "workflow_sse_arrivals_total",
    "counter",
    "Event streams that started from their run's shared writer (its history) without a read of their own "
    "(shared), or read alone until level with it (alone).",
    "path",
    roles=frozenset({API}),
    known=_each("shared", "alone"),
)
RUN_LOOKUPS = _metric(
    "workflow_sse_run_lookups_total",
    "counter",
    "How event streams found their run: its row read from the database (database), or a recent copy kept "
    "by the run's shared writer in this process (writer).",
    "source",
    roles=frozenset({API}),
    known=_each("database", "writer"),
)
RESUMES = _metric(
    "workflow_sse_resumes_total",
    "counter",
    "Requests for a run's events by outcome: attached (no Last-Event-ID), resumed (after one), or the code "
    "it was refused with (invalid_resume_token 400, resume_cursor_expired and run_events_lost 410, "
    "not_found 404, unavailable 503).",
    "outcome",
    roles=frozenset({API}),
    known=_each(*RESUME_OUTCOMES),
)
RESUME_REFUSALS_BY_KEY = _metric(
    "workflow_sse_resume_refusals_by_key_total",
    "counter",
    "Reconnects refused for their resume position (invalid_resume_token, resume_cursor_expired, run_events_lost) "
    "by key bucket (one of 16, a hash of the app): how many apps meet refusals, not how often one does.",
    "key_bucket",
    roles=frozenset({API}),
)
LIMIT_REFUSALS = _metric(
    "workflow_limit_refusals_total",
    "counter",
    "Requests answered 429 by a per-tenant limit, by limit and key bucket (one of 16, a hash of the app, end "
    "user or address refused).",
    "limit",
    "key_bucket",
    roles=frozenset({API}),
)
LAG = _metric(
    "workflow_event_delivery_lag_seconds",
    "histogram",
    "From the worker's append of an event to the API's write of it to a client, for events appended after "
    "the client's request began (live delivery; one sample per write).",
    "transport",
    buckets=LAG_BUCKETS,
    roles=frozenset({API}),
    known=_each(*TRANSPORTS),
)
REPLAYED = _metric(
    "workflow_sse_replayed_events_total",
    "counter",
    "Events a client was sent that were appended before its request began (a resume, a snapshot, a late join).",
    "transport",
    roles=frozenset({API}),
    known=_each(*TRANSPORTS),
)
REPLAY_AGE = _metric(
    "workflow_sse_replay_age_seconds",
    "histogram",
    "Age of the oldest replayed event of each write of replayed events (how far back clients read).",
    "transport",
    buckets=REPLAY_AGE_BUCKETS,
    roles=frozenset({API}),
    known=_each(*TRANSPORTS),
)
RUNS_FINISHED = _metric(
    "workflow_runs_finished_total",
    "counter",
    "Runs that reached a terminal status.",
    "status",
    known=_each("succeeded", "failed", "stopped"),
)
REAPS = _metric(
    "workflow_run_reaps_total",
    "counter",
    "Runs the reaper ended (lease_expired, not_started), queued again (requeued), or whose lost end it "
    "wrote again (end_lost: a stream-store failover lost the end of a finished run).",
    "reason",
    known=_each("lease_expired", "not_started", "requeued", "end_lost"),
)
TASK_SENDS = _metric(
    "workflow_task_sends_total",
    "counter",
    "Task messages handed to the broker by the request that queued their attempt (first) or by the "
    "dispatcher (again: never sent, or not claimed in time), by outcome (ok, failed).",
    "send",
    "outcome",
    known=(("first", "ok"), ("first", "failed"), ("again", "ok"), ("again", "failed")),
)
WATCHDOG_STOPS = _metric(
    "workflow_watchdog_stops_total",
    "counter",
    "Attempts stopped by the APP_MAX_EXECUTION_TIME watchdog.",
    roles=frozenset({WORKER}),
)
RETENTION_REMOVED = _metric(
    "workflow_retention_removed_records_total",
    "counter",
    "Records enforce_retention() removed.",
    roles=frozenset({WORKER}),
)
RETENTION_SWEEPS = _metric(
    "workflow_retention_sweeps_total",
    "counter",
    "enforce_retention() sweeps by outcome: ok or failed.",
    "outcome",
    roles=frozenset({WORKER}),
    known=_each("ok", "failed"),
)

# The Durable Streams gateway's (api/controllers/durable_streams).
#: Exported at 0 from the start, so that the families and the dashboard's panels exist before any request.
GATEWAY_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE")
GATEWAY_REQUESTS = _metric(
    "durable_streams_gateway_requests_total",
    "counter",
    "Durable Streams protocol requests by method and HTTP status.",
    "method",
    "status",
    roles=frozenset({API}),
    known=tuple((method, "200") for method in GATEWAY_METHODS),
)
GATEWAY_SECONDS = _metric(
    "durable_streams_gateway_request_seconds",
    "histogram",
    "Time to answer a Durable Streams protocol request (to its headers; SSE and long-poll bodies excluded).",
    "method",
    buckets=LATENCY_BUCKETS,
    roles=frozenset({API}),
    known=_each(*GATEWAY_METHODS),
)
# Every HTTP request the API answers (the Flask app's; gunicorn's own 400/414 never reach it).
HTTP_REQUESTS = _metric(
    "workflow_http_requests_total",
    "counter",
    "HTTP requests the API answered, by method, route template (e.g. /v1/workflows/run/<workflow_run_id>; "
    "'unmatched' for no route) and status.",
    "method",
    "route",
    "status",
    roles=frozenset({API}),
    known=(("GET", "/health/ready", "200"), ("GET", "/health/ready", "503")),
)
HTTP_SECONDS = _metric(
    "workflow_http_request_seconds",
    "histogram",
    "Time from a request's arrival in the app to its response's headers (an event stream's body excluded), by "
    "method and route template.",
    "method",
    "route",
    buckets=LATENCY_BUCKETS,
    roles=frozenset({API}),
    known=(("GET", "/health/ready"),),
)
HEARTBEATS = _metric(
    "workflow_worker_heartbeats_total",
    "counter",
    "A Celery worker's pings of its own consumer through the broker, by outcome: ok (it answered: it consumes) "
    "or failed (no answer in time, or no broker).",
    "outcome",
    roles=frozenset({WORKER}),
    known=_each("ok", "failed"),
)

METRICS: tuple[Metric, ...] = (
    APPENDS,
    APPEND_SECONDS,
    RECORDS_READ,
    SUBSCRIPTIONS_OPEN,
    BACKLOG,
    CURSOR_UNAVAILABLE,
    UNAVAILABLE,
    STREAMS_OPEN,
    WRITERS_OPEN,
    HANDBACKS,
    ADMISSION_REFUSED,
    ARRIVALS,
    RUN_LOOKUPS,
    RESUMES,
    RESUME_REFUSALS_BY_KEY,
    LIMIT_REFUSALS,
    LAG,
    REPLAYED,
    REPLAY_AGE,
    RUNS_FINISHED,
    REAPS,
    TASK_SENDS,
    WATCHDOG_STOPS,
    RETENTION_REMOVED,
    RETENTION_SWEEPS,
    GATEWAY_REQUESTS,
    GATEWAY_SECONDS,
    HTTP_REQUESTS,
    HTTP_SECONDS,
    HEARTBEATS,
)

_enabled = False


def enable() -> None:
    """Count the per-delivery samples too (the delivery lag): only worth it when something publishes them."""
    global _enabled
    _enabled = True


def enabled() -> bool:
    return _enabled


def exported_names() -> frozenset[str]:
    """Every sample name the app exports (a histogram's ``_bucket``, ``_sum`` and ``_count`` included)."""
    names: set[str] = set()
    for metric in METRICS:
        if metric.kind == "histogram":
            names.update(f"{metric.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(metric.name)
    return frozenset(names)


def observe_lag(transport: str, stamp: float) -> None:
    """One delivery-lag sample: an event the worker stamped at ``stamp`` (``time.time()``) is written now."""
    if _enabled:
        LAG.tally.observe((transport,), time.time() - stamp)


def observe_replay(transport: str, stamp: float, events: int) -> None:
    """A write of ``events`` replayed events, the oldest stamped at ``stamp``."""
    if _enabled:
        REPLAYED.tally.add((transport,), events)
        REPLAY_AGE.tally.observe((transport,), time.time() - stamp)


class StreamMetrics:
    """The durable-stream observer (``api.core.durable_stream.DurableStreamObserver``) that counts into tallies."""

    def appended(self, backend: str, outcome: str, seconds: float) -> None:
        APPENDS.tally.add((backend, outcome))
        APPEND_SECONDS.tally.observe((backend,), seconds)

    def records_read(self, backend: str, count: int) -> None:
        if count:
            RECORDS_READ.tally.add((backend,), count)

    def subscription_opened(self, backend: str) -> None:
        SUBSCRIPTIONS_OPEN.tally.add((backend,))

    def subscription_started(self, backend: str, start: str, backlog: int) -> None:
        BACKLOG.tally.observe((backend, start), backlog)

    def subscription_closed(self, backend: str) -> None:
        SUBSCRIPTIONS_OPEN.tally.add((backend,), -1)

    def cursor_unavailable(self, backend: str, reason: str) -> None:
        CURSOR_UNAVAILABLE.tally.add((backend, reason))

    def unavailable(self, backend: str) -> None:
        UNAVAILABLE.tally.add((backend,))


def _reset_after_fork() -> None:
    # What the parent counted is the parent's to publish; a forked child starts from nothing.
    for metric in METRICS:
        metric.tally.reset()


os.register_at_fork(after_in_child=_reset_after_fork)
