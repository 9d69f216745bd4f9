"""Prometheus metrics for the API (gunicorn) and the Celery workers, multiprocess-safe.

Off unless the process's role has a bind: ``API_METRICS_BIND`` (the gunicorn master serves
``/metrics`` on it, a listener of its own, never the API's port) or ``WORKER_METRICS_BIND`` (the
Celery worker's main process serves it). With a bind, every process of the role:

- points ``PROMETHEUS_MULTIPROC_DIR`` at ``METRICS_DIR/<role>`` *before* ``prometheus_client`` is
  imported, so each gunicorn worker, Celery pool child or thread pool writes its own files and the
  exporter sums them (a dead process's live gauges are dropped when it exits);
- registers :class:`api.libs.metrics.StreamMetrics` as the durable-stream observer;
- publishes the tallies of :mod:`api.libs.metrics` every ``METRICS_FLUSH_INTERVAL`` seconds from a
  thread (a greenlet under gevent), so the paths that count never touch ``prometheus_client``.
"""

from __future__ import annotations

import atexit
import logging
import os
import pathlib
import shutil
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

from flask import Flask, Response, g, request

from api.configs import AppConfig, ConfigurationError
from api.core.durable_stream import adapter_name, set_observer
from api.extensions.ext_durable_stream import stream_url_with_retention
from api.libs import metrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger(__name__)

Role = Literal["api", "worker"]

__all__ = [
    "Publisher",
    "bind_of",
    "count_requests",
    "metrics_dir",
    "prepare_directory",
    "process_dead",
    "serve",
    "start",
]


def bind_of(config: AppConfig, role: Role) -> str:
    return config.API_METRICS_BIND if role == "api" else config.WORKER_METRICS_BIND


def metrics_dir(config: AppConfig, role: Role) -> pathlib.Path:
    return pathlib.Path(config.METRICS_DIR or config.VAR_DIR / "metrics") / role


def prepare_directory(config: AppConfig, role: Role) -> pathlib.Path:
    """Empty the role's directory (a new master or main worker process: old files are of dead processes)
    and point this process and its children at it."""
    directory = metrics_dir(config, role)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    return directory


def _parse_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"a metrics bind must be host:port, not {bind!r}")
    return host or "0.0.0.0", int(port)


def serve(config: AppConfig, role: Role) -> None:
    """Serve the role's metrics, summed over its processes, on its bind (a daemon thread of this process)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    host, port = _parse_bind(bind_of(config, role))
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir(config, role)))  # type: ignore[no-untyped-call]
    start_http_server(port, addr=host, registry=registry)
    logger.info("metrics: serving %s metrics on %s:%d", role, host, port)


def process_dead(config: AppConfig, role: Role, pid: int) -> None:
    """Drop the live gauges of a process that exited (gunicorn's ``child_exit``, a Celery pool child's end)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, path=str(metrics_dir(config, role)))  # type: ignore[no-untyped-call]


class Publisher:
    """Adds what the tallies gained since the last look to the Prometheus metrics."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, role: Role | None = None, backend: str | None = None
    ) -> None:
        """The Prometheus metrics of ``role`` (every metric without one), each known label value at 0;
        ``backend`` is this process's stream-store adapter, for the families labelled by it."""
        from prometheus_client import Counter, Gauge, Histogram

        self._metrics = [metric for metric in metrics.METRICS if role is None or role in metric.roles]
        self._collectors: dict[str, Any] = {}
        for metric in self._metrics:
            if metric.kind == "counter":
                collector: Any = Counter(metric.name, metric.help, metric.labels, registry=registry)
            elif metric.kind == "gauge":
                collector = Gauge(
                    metric.name, metric.help, metric.labels, multiprocess_mode="livesum", registry=registry
                )
            else:
                collector = Histogram(
                    metric.name, metric.help, metric.labels, buckets=metric.buckets, registry=registry
                )
            self._collectors[metric.name] = collector
            for known in metric.known:
                if metrics.BACKEND in known and backend is None:
                    continue
                collector.labels(*(backend if value == metrics.BACKEND else value for value in known))
        self._published: dict[str, dict[tuple[str, ...], list[float]]] = {}
        self.forget()

    def forget(self) -> None:
        """Start over (in a forked child: its tallies start from nothing, and so do its metric files)."""
        self._published = {metric.name: {} for metric in self._metrics}
        self._lock = threading.Lock()

    def publish(self) -> None:
        with self._lock:  # the thread and the exit hook
            for metric in self._metrics:
                seen = self._published[metric.name]
                collector = self._collectors[metric.name]
                for labels, values in metric.tally.snapshot().items():
                    before = seen.get(labels) or [0.0] * len(values)
                    deltas = [now - then for now, then in zip(values, before, strict=True)]
                    seen[labels] = values
                    if any(deltas):
                        _add(collector.labels(*labels) if labels else collector, metric.kind, deltas)


def _add(child: Any, kind: str, deltas: list[float]) -> None:
    if kind == "counter" or kind == "gauge":
        child.inc(deltas[0])
    else:
        # prometheus_client keeps a histogram as one value per bucket (not cumulative) plus the sum:
        # add the counts per bucket at once rather than replaying every observation
        # (tests/app/test_metrics_units.py checks this against observe()).
        for bucket, delta in zip(child._buckets, deltas[:-1], strict=True):
            if delta:
                bucket.inc(delta)
        child._sum.inc(deltas[-1])


_started: list[Publisher] = []


def require_serving(config: AppConfig) -> None:
    """Refuse to serve the API with ``API_METRICS_BIND`` set where nothing would serve the metrics: only
    gunicorn's master with ``api.gunicorn_conf`` does (it sums its workers' files).

    Raises:
        ConfigurationError: The bind is set, and gunicorn runs without the project's config.
    """
    # Only a gunicorn server: the app module is also imported by `flask --app api.app create-app`.
    if config.API_METRICS_BIND and "gunicorn" in sys.modules and os.environ.get("API_GUNICORN_CONF") != "1":
        raise ConfigurationError(
            f"API_METRICS_BIND={config.API_METRICS_BIND} is set, but nothing serves the API's metrics: start gunicorn "
            "with --config python:api.gunicorn_conf (its master serves them), or unset API_METRICS_BIND"
        )


def start(config: AppConfig, role: Role) -> bool:
    """Count and publish this process's metrics if the role has a bind; return whether it does."""
    if not bind_of(config, role):
        return False
    directory = metrics_dir(config, role)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)  # read when prometheus_client makes a value
    set_observer(metrics.StreamMetrics())
    metrics.enable()
    if not _started:
        _started.append(Publisher(role=role, backend=adapter_name(stream_url_with_retention(config))))
        atexit.register(_started[0].publish)
    start_publishing(config.METRICS_FLUSH_INTERVAL)
    return True


def start_publishing(interval: float) -> None:
    """The publishing thread of this process (again in a forked child, whose parent's thread is gone)."""
    publisher = _started[0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                publisher.publish()
            except Exception:  # a full disk, say: counting goes on, the next look adds it all
                logger.exception("metrics: publishing failed")

    threading.Thread(target=loop, name="metrics-publisher", daemon=True).start()


def _forget_after_fork() -> None:
    if _started:
        _started[0].forget()


os.register_at_fork(after_in_child=_forget_after_fork)


def init_worker(config: AppConfig) -> None:
    """Metrics in a Celery worker: the exporter in the main process, publishing in every pool process."""
    if not bind_of(config, "worker"):
        return
    from celery import signals

    def starting(**_: object) -> None:
        # The worker's main process only (not celery beat, which loads the same app), before its pool.
        prepare_directory(config, "worker")
        start(config, "worker")

    def ready(**_: object) -> None:
        serve(config, "worker")

    def child_started(**_: object) -> None:
        start_publishing(config.METRICS_FLUSH_INTERVAL)

    def child_ending(**_: object) -> None:
        _started[0].publish()
        process_dead(config, "worker", os.getpid())

    signals.worker_init.connect(starting, weak=False)
    signals.worker_ready.connect(ready, weak=False)
    signals.worker_process_init.connect(child_started, weak=False)
    signals.worker_process_shutdown.connect(child_ending, weak=False)


def count_requests(app: Flask) -> None:
    """Count every request ``app`` answers, by method, route template and status, and time it to its
    response's headers (``workflow_http_requests_total``, ``workflow_http_request_seconds``): into the
    tallies only, published where the role has a bind."""

    def arrived() -> None:
        g.metrics_arrived = time.perf_counter()

    def answered(response: Response) -> Response:
        rule = request.url_rule
        route = rule.rule if rule is not None else "unmatched"
        metrics.HTTP_REQUESTS.tally.add((request.method, route, str(response.status_code)))
        arrived_at = g.get("metrics_arrived")
        if arrived_at is not None:
            metrics.HTTP_SECONDS.tally.observe((request.method, route), time.perf_counter() - arrived_at)
        return response

    # First of the app's hooks: a hook that answers early (a refusal) stops the ones after it.
    app.before_request_funcs.setdefault(None, []).insert(0, arrived)
    app.after_request(answered)
