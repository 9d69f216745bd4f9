"""gunicorn settings shared by ``bin/run``, the compose file and the test harness.

Used as ``gunicorn --config python:api.gunicorn_conf …``; options given on the command line win.

- ``worker_connections`` (``WEB_WORKER_CONNECTIONS``, default 10000): how many connections one gevent
  worker accepts at once. Every open event stream holds one, and gunicorn's default of 1000 would cap
  a worker at 1000 SSE clients (the rest wait in the listen backlog) long before its CPU or memory do.
- ``post_worker_init`` calls ``gc.freeze()`` once the app is loaded in each worker: the objects made at
  start-up (modules, the Flask app, SQLAlchemy metadata, settings) then live in the permanent
  generation and are no longer scanned by every full collection, which a worker holding thousands of
  streams otherwise runs over hundreds of thousands of objects, stalling every stream while it does.
- It lets each worker admit at most 95% of the event streams it can hold (``SSE_MAX_STREAMS`` unset:
  its ``worker_connections`` or its open-file limit, raised to the hard limit, whichever is lower): a
  full worker answers 503 with a Retry-After rather than leaving clients in the listen backlog.
- It starts the API process's reaper (``API_REAPER_INTERVAL``; ``api.tasks.reaper``), so a run
  whose worker died ends within its lease and one sweep even with no Celery worker left and nobody
  reading it.
- On SIGTERM it drains the worker's event streams (``drain_on_exit``): each ends with a ``retry:`` and
  its client resumes on another worker. In a reload (``kill -HUP``) the replaced workers drain once
  the new workers are ready (at most ``graceful_timeout`` - 1.5 s later): their clients keep their
  streams while the new ones start, then come back to workers that can take them (all of them: the
  first one ready would otherwise accept every client that comes back).
- It also turns off gevent's greenlet-tree tracking (unless ``GEVENT_TRACK_GREENLET_TREE`` is set): with
  it, every connection's greenlet keeps a copy of the stack that spawned it (about nine frame records
  and their lists), long-lived objects the cyclic GC would scan for as long as the stream is open.
- ``logger_class`` is gunicorn's logger with access lines that compute only the atoms their format
  names (``api.gunicorn_logging``): gunicorn's own builds every atom for every request. The access log
  is on (``ACCESS_LOG``), its JSON lines' fields are fields, query values and form tokens redacted.
- What gunicorn answers itself (414 for a request line over 4,094 bytes, 400 for a malformed request)
  is JSON like the API's errors, not gunicorn's HTML page; its control socket is one per master.
- It looks at the oldest GC generation ten times less often than CPython's default
  (``FULL_COLLECTION_PERIOD``, ``GC_FULL_COLLECTION_PERIOD``): while thousands of clients arrive, each
  full collection stalls every stream of the worker for 100-300 ms and frees almost nothing.
- With ``GC_PAUSE_LOG_MS`` set, every collection of the oldest generation that takes longer than that
  many milliseconds is logged (a pause of every stream of the worker while it runs).
- A stop (SIGTERM, SIGINT, SIGQUIT) that reaches a worker while it boots is not lost (``post_fork``):
  until the worker sets its own handlers, its master's, inherited by the fork, only queue the signal, and
  the master would then wait out ``graceful_timeout`` for a worker that never heard it. The worker
  acts on it as soon as it has booted.
- With ``API_METRICS_BIND`` set, the master empties ``METRICS_DIR/api`` before any worker starts,
  serves the workers' summed Prometheus metrics on that bind once ready, and drops a dead worker's
  live gauges (see ``api.extensions.ext_metrics``).
"""

from __future__ import annotations

import gc
import os
import pathlib
import queue
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

DEFAULT_WORKER_CONNECTIONS = 10000

worker_connections = int(os.environ.get("WEB_WORKER_CONNECTIONS") or DEFAULT_WORKER_CONNECTIONS)
#: The access log is on, on stdout (``ACCESS_LOG``: another file, or ``off``); with ``LOG_FORMAT=json`` each
#: line is a JSON object whose fields (method, path, status, bytes, duration_ms, query) are fields of its own.
#: No header, no query value (``?last_event_id=`` is a resume token) and no form token (a bearer capability)
#: is written (``api.gunicorn_logging``).
accesslog = (
    None
    if os.environ.get("ACCESS_LOG", "-").strip().lower() in ("", "off", "none")
    else os.environ.get("ACCESS_LOG", "-")
)
access_log_format = '%(h)s "%(m)s %(U)s" %(s)s %(B)s %(M)sms'
#: gunicorn's control socket, one per master (gunicorn's default is one path for every instance on the
#: machine, the last one started taking it over): ``gunicornc -s <this path>``; the log says it at start.
control_socket = os.path.join(tempfile.gettempdir(), f"api-gunicorn-{os.getpid()}", "control.ctl")

#: What gunicorn answers itself, before the app (a request line too long, a malformed request or header).
GUNICORN_ERROR_CODES = {400: "bad_request", 414: "uri_too_long", 431: "request_header_fields_too_large"}


def write_json_error(sock: Any, status: int, reason: str, message: str) -> None:
    """gunicorn's own error answers as the API's errors are: a JSON object with ``code``, ``message`` and
    ``status`` (gunicorn writes an HTML page)."""
    import json

    from gunicorn import util

    code = GUNICORN_ERROR_CODES.get(status, "bad_request" if status < 500 else "internal_error")
    body = json.dumps({"code": code, "message": message, "status": status}).encode()
    head = f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
    util.write_nonblock(sock, (head + f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body)


def _answer_gunicorns_errors_in_json() -> None:
    from gunicorn import util

    util.write_error = write_json_error  # what gunicorn's workers call for the answers they write themselves


_answer_gunicorns_errors_in_json()
logger_class = "api.gunicorn_logging.AccessLogger"


#: The signals that stop a worker (gunicorn: SIGTERM drains, SIGINT and SIGQUIT quit at once).
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGQUIT})


def post_fork(server: Any, worker: Any) -> None:
    """In a new worker, before it has handlers of its own: keep the master's signal queue, where the
    master's handler (this process's until then) puts any signal that arrives in the meantime."""
    worker.signals_before_boot = getattr(server, "SIG_QUEUE", None)


def act_on_stops_missed_at_boot(worker: Any) -> None:
    """Send this worker again the stop signals that came before it had its handlers, now that it does.

    The queue is this process's copy of the master's: it may also hold what the master had not read
    when it forked, and a stop pending there means the master is stopping too.
    """
    pending = getattr(worker, "signals_before_boot", None)
    if pending is None or not hasattr(pending, "get_nowait"):
        return
    missed: list[int] = []
    while True:
        try:
            sig = pending.get_nowait()
        except queue.Empty:
            break
        if sig in STOP_SIGNALS and sig not in missed:
            missed.append(sig)
    for sig in missed:
        worker.log.info("%s came while this worker booted: acting on it now", signal.Signals(sig).name)
        os.kill(os.getpid(), sig)


def post_worker_init(worker: Any) -> None:
    """After the app is loaded in a worker: collect once, then move everything that exists now out of the GC's sight."""
    if "GEVENT_TRACK_GREENLET_TREE" not in os.environ and "gevent" in sys.modules:
        import gevent

        gevent.config.track_greenlet_tree = False
    app = getattr(worker, "wsgi", None)  # our Flask app; another WSGI app gets neither of these
    if app is not None and "APP_CONFIG" in getattr(app, "config", {}):
        from api.tasks.reaper import start_in_api_worker

        reaper = start_in_api_worker(app)
        if reaper is not None:
            worker.log.info("reaper: sweeping every %g s in this API worker", reaper.interval)
        _limit_streams(worker, app)
        if "gevent" in sys.modules:
            drain_on_exit(worker)
    gc.collect()
    gc.freeze()
    _space_full_collections(worker)
    worker.log.info("gc.freeze(): %d start-up objects are no longer scanned by the cyclic GC", gc.get_freeze_count())
    milliseconds = _env_number(worker, "GC_PAUSE_LOG_MS", float, "a number of milliseconds: no GC pause log")
    if milliseconds is not None:
        gc.callbacks.append(pause_logger(worker.log, milliseconds / 1000))
    if isinstance(getattr(worker, "ppid", None), int):  # a gunicorn worker (not a test's stand-in)
        (_marks(worker.ppid) / f"ready-{worker.pid}").write_text(repr(time.time()))
    act_on_stops_missed_at_boot(worker)


#: Open files a worker keeps for everything but its clients' sockets (its store and database
#: connections, log files, the listening socket).
FILES_RESERVED = 200


def _limit_streams(worker: Any, app: Any) -> None:
    """Admit at most 95% of the event streams this worker can hold open (``SSE_MAX_STREAMS`` unset): its
    connections (``worker_connections``) or its open files, whichever is fewer. A full worker then still
    accepts a connection and answers it 503 with a Retry-After, instead of leaving it in the listen
    backlog (or failing its accept for want of a file descriptor)."""
    import resource

    from api.services.delivery import current_runtime

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    with app.app_context():
        admission = current_runtime().admission
        if admission.max_streams:
            return
        files = soft if soft != resource.RLIM_INFINITY else worker.cfg.worker_connections
        admission.max_streams = max(1, int(0.95 * min(worker.cfg.worker_connections, files - FILES_RESERVED)))
    worker.log.info("admission: at most %d event streams open in this worker", admission.max_streams)


def on_reload(server: Any) -> None:
    """In the master, as a reload begins: the workers it is about to replace drain once a new one is ready."""
    (_marks(server.pid) / "reload").write_text(repr(time.time()))


def on_exit(server: Any) -> None:
    import shutil

    shutil.rmtree(_marks(server.pid), ignore_errors=True)


def _marks(master_pid: int) -> pathlib.Path:
    """Where one gunicorn master and its workers leave each other marks: a reload began; a worker is ready."""
    directory = pathlib.Path(tempfile.gettempdir()) / f"api-gunicorn-{master_pid}"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def successors_ready(master_pid: int, since: float) -> int:
    """How many workers of this master became ready at ``since`` or later."""
    ready = 0
    for mark in _marks(master_pid).glob("ready-*"):
        try:
            ready += float(mark.read_text() or 0) >= since
        except (OSError, ValueError):
            continue
    return ready


def reload_began(master_pid: int) -> float | None:
    """When the master's reload in progress began, if one is."""
    try:
        return float((_marks(master_pid) / "reload").read_text())
    except (OSError, ValueError):
        return None


def drain_on_exit(worker: Any) -> None:
    """On SIGTERM (a stop, or a reload's replacement of this worker) the worker stops accepting, as
    gunicorn does, and its open event streams end at once with a ``retry:`` (spread at random), so
    their clients resume on another worker with ``Last-Event-ID`` instead of waiting out the graceful
    timeout and then losing their connection. gunicorn then finds no connection left and exits."""
    import gevent

    from api.services.delivery import current_runtime

    stop = worker.handle_exit
    app = worker.wsgi

    def drain() -> None:
        began = reload_began(worker.ppid)
        if began is not None and time.time() - began < worker.cfg.graceful_timeout:
            # Replaced by a reload: keep the streams until the new workers can take them (they are
            # still importing the app now), within the graceful timeout.
            deadline = time.monotonic() + max(0.0, min(10.0, worker.cfg.graceful_timeout - 1.5))
            # All of them: the first one ready would otherwise accept every client that comes back.
            while successors_ready(worker.ppid, began) < worker.cfg.workers and time.monotonic() < deadline:
                gevent.sleep(0.05)
        with app.app_context():
            current_runtime().drain()

    def handle_exit(sig: int, frame: Any) -> None:
        stop(sig, frame)
        gevent.spawn(drain)  # out of the signal handler, on the hub

    signal.signal(signal.SIGTERM, handle_exit)


#: Young-generation collections between two looks at the oldest generation (CPython's default: 10).
FULL_COLLECTION_PERIOD = 100


def _space_full_collections(worker: Any) -> None:
    """Look at the oldest generation ten times less often than CPython does.

    A full collection scans every tracked object the worker holds; with thousands of streams open that
    is a pause of every stream of the worker of 100-300 ms, and while clients arrive CPython runs one
    every second or two (each time the survivors grew by a quarter), collecting about a hundred
    objects each time (docs/benchmarks.md). Young collections, which free almost all of a request's
    cyclic garbage, are unchanged. ``GC_FULL_COLLECTION_PERIOD`` overrides the period.
    """
    period = _env_number(worker, "GC_FULL_COLLECTION_PERIOD", int, f"a whole number: {FULL_COLLECTION_PERIOD} kept")
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_PERIOD if period is None else max(period, 1))


def _env_number[Number: (int, float)](
    worker: Any, name: str, parse: Callable[[str], Number], refusal: str
) -> Number | None:
    """An optional numeric setting of the environment; ``None`` (and a warning) for one that is not a number."""
    text = os.environ.get(name)
    if not text:
        return None
    try:
        return parse(text)
    except ValueError:
        worker.log.warning("%s=%r is not %s", name, text, refusal)
        return None


def pause_logger(log: Any, threshold: float) -> Any:
    """A ``gc.callbacks`` entry that logs full collections taking ``threshold`` seconds or more."""
    started = [0.0]

    def on_collection(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
            return
        seconds = time.perf_counter() - started[0]
        if seconds >= threshold:
            log.warning("a full GC collection took %.0f ms (%d objects collected)", seconds * 1000, info["collected"])

    return on_collection


def _metrics_config() -> Any:
    from api.configs import load_config

    config = load_config()
    return config if config.API_METRICS_BIND else None


#: Set in the master's environment (so its workers inherit it): this file's hooks are in force.
CONFIG_MARK = "API_GUNICORN_CONF"


def on_starting(server: Any) -> None:
    """Refuse to start (one line per problem) before any worker does, then prepare the metrics."""
    from api.startup import check_or_exit

    gateway = "durable_streams_app" in str(getattr(server.cfg, "wsgi_app", "") or "")
    check_or_exit("gateway" if gateway else "api")
    os.environ[CONFIG_MARK] = "1"
    config = _metrics_config()
    if config is not None:
        from api.extensions import ext_metrics

        ext_metrics.prepare_directory(config, "api")


def when_ready(server: Any) -> None:
    config = _metrics_config()
    if config is not None:
        from api.extensions import ext_metrics

        ext_metrics.serve(config, "api")


def child_exit(server: Any, worker: Any) -> None:
    config = _metrics_config()
    if config is not None:
        from api.extensions import ext_metrics

        ext_metrics.process_dead(config, "api", worker.pid)
