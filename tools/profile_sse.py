"""CPU per delivered SSE event, idle CPU and memory per stream of one API process, in-process under gevent.

``python -m tools.profile_sse [--clients 2000 10000] [--runs 40] [--rate 40] [--seconds 15] [--idle 25]``
``python -m tools.profile_sse --micro``: µs per event of the edge's own steps (name, token, framing).
``--metrics``: with the app's metrics on (the durable-stream observer and the delivery-lag samples)
and the producer storing events with their envelope (``event_codec.stamped``), as workers do.

For each client count a fresh child process (monkey-patched by gevent, like a gunicorn gevent
worker) builds the app on the shared Redis (streams, under a key prefix of its own) and an SQLite
app database, creates ``--runs`` running runs with a live lease and their ``workflow_started``,
and opens N streams spread over them, each the real response of a reconnect
(``event_stream_response`` of ``delivery.reconnect``) iterated as a WSGI server
would, every chunk written to ``/dev/null`` (one system call per chunk, as a socket send is).
Then it measures:

- ``rss_kb_per_stream``: the process's RSS growth from before the first stream to all streams
  connected, per stream;
- ``idle_cpu``: the process's CPU share while the runs are quiet (``--idle`` seconds);
- ``us_per_event``: process CPU per delivered event while a producer *process* appends ``--rate``
  events per second in total over the runs (``--seconds`` seconds), and the delivery latency
  (p50/p99, sampled on one stream per run) and the chunks written per delivered event.

The producer's CPU is not counted: it runs in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import yaml

_PRODUCER = """
import json, sys, time
from api.core.durable_stream import connect
url, topics, rate, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
envelope = sys.argv[5:] == ["stamped"]
backend = connect(url)
handles = [backend.topic(name) for name in topics]
text = "x" * 40
interval, start, sent = 1.0 / rate, time.monotonic(), 0
while time.monotonic() - start < seconds:
    topic = handles[sent % len(handles)]
    body = {"event": "text_chunk", "task_id": "t", "workflow_run_id": "r", "data": {"text": text, "ts": time.time()}}
    payload = json.dumps(body, separators=(",", ":")).encode()
    topic.append(b"\x1e%017.6f" % time.time() + payload if envelope else payload)
    sent += 1
    delay = start + sent * interval - time.monotonic()
    if delay > 0:
        time.sleep(delay)
print(sent)
backend.close()
"""


def _rss_kb() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _type_counts() -> dict[str, int]:
    import collections
    import gc

    return dict(collections.Counter(type(item).__qualname__ for item in gc.get_objects()))


def _profiler() -> Any:
    import cProfile

    profiler = cProfile.Profile(time.process_time)  # CPU time: waits in other greenlets do not count
    profiler.enable()
    return profiler


def _print_profile(profiler: Any, phase: str) -> None:
    import pstats

    profiler.disable()
    print(f"--- {phase} phase, by own CPU time", file=sys.stderr)
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def measure(
    clients: int, runs: int, rate: float, seconds: float, idle: float, profile: bool = False, metrics: bool = False
) -> dict[str, Any]:
    """One measurement in this (patched) process; see the module docstring."""
    import gc
    import pathlib
    import re
    import tempfile
    import uuid

    import gevent

    from api.app_factory import create_app
    from api.configs import AppConfig
    from api.controllers.common.workflow_responses import event_stream_response
    from api.core.app.apps.event_codec import encode_event
    from api.core.app.apps.message_generator import StartAt
    from api.extensions.ext_event_bus import event_transport
    from api.models import WorkflowRun
    from api.models.engine import db
    from api.services import app_service, run_recovery
    from api.services import workflow_run_service as run_service
    from harness.app_env import base_env
    from harness.services import redis_url

    if metrics:
        from api.core.durable_stream import set_observer
        from api.libs import metrics as app_metrics

        set_observer(app_metrics.StreamMetrics())
        app_metrics.enable()
    var_dir = pathlib.Path(tempfile.mkdtemp(prefix="profile-sse-"))
    stream_url = redis_url(0, f"key_prefix=profile-{uuid.uuid4().hex[:8]}")
    env = base_env(
        var_dir,
        DURABLE_STREAM_URL=stream_url,
        WORKFLOW_LEASE_TTL=30,
        SSE_PING_INTERVAL=10,
        SSE_IDLE_TIMEOUT=3600,
    )
    app = create_app(AppConfig(**env))  # type: ignore[arg-type]
    definition = yaml.safe_load((pathlib.Path(__file__).resolve().parents[1] / "examples" / "greeting.yml").read_text())
    with app.app_context():
        app_row = app_service.create_app(definition)
        run_rows = []
        for index in range(runs):
            run = run_service.create_run(app_row, {"name": "n"}, f"user-{index}")
            run.lease_expires_at = time.time() + 3600
            run.attempt_started_at = time.time()
            db.session.commit()
            start_event = run_recovery.started_event_of(app_row, run)
            event_transport().topic(run_service.topic_name(app_row, run)).append(encode_event(start_event))
            run_rows.append(run)
        topics = [run_service.topic_name(app_row, run) for run in run_rows]
        for row in (app_row, *run_rows):
            db.session.refresh(row)
        db.session.expunge_all()
        db.session.remove()
    assert all(isinstance(run, WorkflowRun) for run in run_rows)

    null = os.open(os.devnull, os.O_WRONLY)
    delivered = [0]
    chunks = [0]
    connected = [0]
    latencies: list[float] = []
    stamp = re.compile(rb'"ts":([0-9.]+)')

    def client(index: int) -> None:
        run = run_rows[index % runs]
        sampled = index < runs
        # The route of a reconnect, as a real request would match it (and nothing else).
        with app.test_request_context(f"/v1/workflow/{run.task_id}/events?user={run.end_user}"):
            response = event_stream_response(app_row, run, StartAt.BEGINNING)
        first = True
        for chunk in response.iter_encoded():
            os.write(null, chunk)
            chunks[0] += 1
            count = chunk.count(b"data: ")
            delivered[0] += count
            if first and count:
                first = False
                connected[0] += 1
            if sampled and count:
                now = time.time()
                latencies.extend(now - float(value) for value in stamp.findall(chunk))

    gc.collect()
    types_before = _type_counts() if profile else {}
    rss_before = _rss_kb()
    started = time.monotonic()
    greenlets = []
    for index in range(clients):
        greenlets.append(gevent.spawn(client, index))
        if index % 100 == 99:
            gevent.sleep(0)
    while connected[0] < clients:
        gevent.sleep(0.1)
        if time.monotonic() - started > 300:
            raise RuntimeError(f"only {connected[0]} of {clients} streams connected")
    connect_seconds = time.monotonic() - started
    gevent.sleep(2)  # let the connection work settle
    gc.collect()
    rss_after = _rss_kb()
    if profile:
        grown = _type_counts()
        top = sorted(((count - types_before.get(name, 0), name) for name, count in grown.items()), reverse=True)
        print("objects per stream (tracked by the GC):", file=sys.stderr)
        for count, name in top[:25]:
            print(f"  {count / clients:8.2f} {name}", file=sys.stderr)

    profiler = _profiler() if profile else None
    cpu0, wall0 = _cpu(), time.monotonic()
    gevent.sleep(idle)
    idle_cpu = (_cpu() - cpu0) / (time.monotonic() - wall0)
    if profiler is not None:
        _print_profile(profiler, "idle")
        profiler = _profiler()
    latencies.clear()
    cpu0, wall0, delivered0, chunks0 = _cpu(), time.monotonic(), delivered[0], chunks[0]
    producer = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, stream_url, json.dumps(topics), str(rate), str(seconds)]
        + (["stamped"] if metrics else []),
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    while producer.poll() is None:
        gevent.sleep(0.2)
    assert producer.stdout is not None
    appended = int(producer.stdout.read().strip() or 0)
    expected = appended * clients // runs
    drain = time.monotonic()
    while delivered[0] - delivered0 < expected and time.monotonic() - drain < 30:
        gevent.sleep(0.05)
    cpu = _cpu() - cpu0
    wall = time.monotonic() - wall0
    events = delivered[0] - delivered0
    latencies.sort()
    if profiler is not None:
        _print_profile(profiler, "load")

    def quantile(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2) if latencies else -1.0

    return {
        "clients": clients,
        "runs": runs,
        "connect_seconds": round(connect_seconds, 1),
        "rss_kb_per_stream": round((rss_after - rss_before) / clients, 1),
        "idle_cpu": round(idle_cpu, 4),
        "appended": appended,
        "delivered": events,
        "expected": expected,
        "load_cpu": round(cpu / wall, 3),
        "us_per_event": round(cpu / max(events, 1) * 1e6, 1),
        "chunks_per_event": round((chunks[0] - chunks0) / max(events, 1), 3),
        "latency_ms_p50": quantile(0.5),
        "latency_ms_p99": quantile(0.99),
    }


def micro(number: int = 20000) -> dict[str, float]:
    """µs per call of what the HTTP edge does for each event: read its name, seal its cursor, frame it."""
    import timeit

    from api.controllers.common import sse
    from api.core.app.apps.event_codec import encode_event, event_name
    from api.libs.resume_token import ResumeTokenCodec, development_key

    codec = ResumeTokenCodec([development_key("profile")])
    bound = {"topic": "workflow:workflow_run:" + "r" * 36, "app_id": "a" * 36, "end_user": "user-1"}
    text = {"text": "hello world " * 4}
    payload = encode_event({"event": "text_chunk", "task_id": "t" * 36, "workflow_run_id": "r" * 36, "data": text})
    cursor = "1." + "A" * 64  # the length of a Redis topic's cursor

    def per_call(call: Any) -> float:
        return round(min(timeit.repeat(call, number=number, repeat=9)) / number * 1e6, 3)

    results = {"event_name": per_call(lambda: event_name(payload))}
    results["codec.seal"] = per_call(lambda: codec.seal(cursor, **bound))
    sealer = getattr(codec, "sealer", None)
    if sealer is not None:  # this tree has per-stream sealers
        stream_sealer = sealer(**bound)
        results["sealer.seal_bytes"] = per_call(lambda: stream_sealer.seal_bytes(cursor))
        token = stream_sealer.seal_bytes(cursor)
        results["frame"] = per_call(lambda: sse.sse_message(payload, event_id=token))
    else:
        token_text = codec.seal(cursor, **bound)
        frame_text: Any = sse.sse_message  # the str framing of older trees
        results["frame"] = per_call(lambda: frame_text(payload.decode(), event_id=token_text).encode())
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--rate", type=float, default=40.0, help="events appended per second, over all runs")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long the producer appends")
    parser.add_argument("--idle", type=float, default=25.0, help="how long the idle CPU is measured")
    parser.add_argument("--profile", action="store_true", help="cProfile both phases, count objects (stderr)")
    parser.add_argument("--micro", action="store_true", help="only the per-event micro-benchmark")
    parser.add_argument("--metrics", action="store_true", help="metrics on, events stored with their envelope")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.micro:
        print(json.dumps(micro()))
        return
    if args.one:
        result = measure(args.clients[0], args.runs, args.rate, args.seconds, args.idle, args.profile, args.metrics)
        print(json.dumps(result), flush=True)
        os._exit(0)  # thousands of open streams: no orderly teardown to wait for
    for clients in args.clients:
        command = [sys.executable, "-m", "gevent.monkey", "--module", "tools.profile_sse", "--one"]
        command += ["--clients", str(clients), "--runs", str(args.runs), "--rate", str(args.rate)]
        command += ["--seconds", str(args.seconds), "--idle", str(args.idle)] + (["--profile"] * args.profile)
        command += ["--metrics"] * args.metrics
        output = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
        print(output.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
