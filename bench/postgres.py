"""Benchmarks of the PostgreSQL adapter.

Run ``.venv/bin/python -m bench.postgres`` (``--quick`` for a smoke run, ``--url`` for another
server). It prints a table and writes ``bench/results/postgres-<date>.json``. Everything happens in
a schema of its own on the target server, dropped at the end. See ``docs/benchmarks.md``.

Scenarios:

- append: 1 producer on 1 topic and 16 producers on 16 topics, records/s, against a raw psycopg
  loop doing one plain ``INSERT`` per transaction on the same server (same threads, same payload).
- latency: append -> ``receive()`` on another backend object, woken by NOTIFY, and with hints
  disabled (only the ~1 s fallback poll delivers).
- catch-up: one subscription draining 100,000 retained records.
- fan-out: 2,000 subscriptions on 200 topics in one gevent process (the API worker's shape), fed by
  another process: connections used and delivery latency.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import append_timestamps, follow_timestamps
from harness.services import POSTGRES_DSN

DEFAULT_URL = POSTGRES_DSN
PAYLOAD_SIZE = 200
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _run_threads(count: int, target: Callable[[int], None]) -> float:
    """Start ``count`` threads at once, return the wall time until the last one finished."""
    barrier = threading.Barrier(count + 1)
    errors: list[BaseException] = []

    def body(index: int) -> None:
        barrier.wait()
        try:
            target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


class Bench:
    def __init__(self, url: str, quick: bool) -> None:
        self.url = url
        self.quick = quick
        self.schema = f"ds_bench_{uuid.uuid4().hex[:10]}"
        self.payload = b"x" * PAYLOAD_SIZE

    def psycopg_connect(self, **kwargs: Any) -> Any:
        import psycopg

        return psycopg.connect(self.url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True, **kwargs)

    def connect(self, **options: Any) -> Any:
        from api.core.durable_stream import connect

        return connect(self.url, schema=self.schema, **options)

    def server_facts(self) -> dict[str, str]:
        with self.psycopg_connect() as conn:
            facts = {}
            for setting in ("server_version", "synchronous_commit", "fsync", "max_connections"):
                facts[setting] = str(conn.execute(f"SHOW {setting}").fetchone()[0])  # type: ignore[index]
            return facts

    def drop_schema(self) -> None:
        with self.psycopg_connect() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    # -- append throughput ---------------------------------------------------------------------

    def raw_inserts(self, producers: int, per_producer: int) -> float:
        with self.psycopg_connect() as conn:
            conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{self.schema}".raw_baseline '
                "(id bigserial PRIMARY KEY, payload bytea NOT NULL)"
            )
        connections = [self.psycopg_connect() for _ in range(producers)]
        try:

            def produce(index: int) -> None:
                conn = connections[index]
                for _ in range(per_producer):
                    conn.execute(f'INSERT INTO "{self.schema}".raw_baseline (payload) VALUES (%s)', (self.payload,))

            elapsed = _run_threads(producers, produce)
        finally:
            for conn in connections:
                conn.close()
        return producers * per_producer / elapsed

    def adapter_appends(self, producers: int, per_producer: int) -> float:
        with self.connect(pool_size=producers) as backend:
            topics = [backend.topic(f"append-{uuid.uuid4().hex}") for _ in range(producers)]
            for topic in topics:
                topic.append(self.payload)  # create the topic and warm a pooled connection

            def produce(index: int) -> None:
                topic = topics[index]
                for _ in range(per_producer):
                    topic.append(self.payload)

            return producers * per_producer / _run_threads(producers, produce)

    def bench_append(self) -> list[dict[str, Any]]:
        rows = []
        for producers, total in ((1, 3000 if self.quick else 10000), (16, 4800 if self.quick else 32000)):
            per_producer = total // producers
            raw_runs, adapter_runs = [], []
            for _ in range(1 if self.quick else 3):  # interleaved: the machine's load drifts
                raw_runs.append(self.raw_inserts(producers, per_producer))
                adapter_runs.append(self.adapter_appends(producers, per_producer))
            raw, adapter = statistics.median(raw_runs), statistics.median(adapter_runs)
            rows.append(
                {
                    "producers": producers,
                    "topics": producers,
                    "records": per_producer * producers,
                    "adapter_records_per_s": round(adapter),
                    "raw_insert_records_per_s": round(raw),
                    "ratio": round(adapter / raw, 2),
                    "adapter_runs": [round(r) for r in adapter_runs],
                    "raw_runs": [round(r) for r in raw_runs],
                }
            )
        return rows

    # -- latency -------------------------------------------------------------------------------

    def latency(self, *, hints: bool, rate: float, duration: float, topics: int) -> dict[str, Any]:
        """Append at ``rate``/s spread over ``topics``; each topic has a subscriber thread on another backend."""
        from api.core.durable_stream import CLOSED

        with self.connect(notify=hints) as writer, self.connect() as reader:
            names = [f"latency-{uuid.uuid4().hex}" for _ in range(topics)]
            subscriptions = [reader.topic(name).subscribe_from_tail() for name in names]
            for subscription in subscriptions:
                subscription.__enter__()
            latencies: list[float] = []
            lock = threading.Lock()
            stop = threading.Event()

            def consume(index: int) -> None:
                subscription = subscriptions[index]
                while not stop.is_set():
                    record = subscription.receive(timeout=0.5)
                    if record is None or record is CLOSED:
                        continue
                    delay = time.time() - float(record.payload)
                    with lock:
                        latencies.append(delay)

            consumers = [threading.Thread(target=consume, args=(i,)) for i in range(topics)]
            for consumer in consumers:
                consumer.start()
            time.sleep(0.5)  # subscriptions watched and LISTENing
            sent = 0
            started = time.monotonic()
            while time.monotonic() - started < duration:
                writer.topic(random.choice(names)).append(repr(time.time()).encode())
                sent += 1
                time.sleep(random.expovariate(rate))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                with lock:
                    if len(latencies) >= sent:
                        break
                time.sleep(0.05)
            stop.set()
            for consumer in consumers:
                consumer.join()
            for subscription in subscriptions:
                subscription.close()
        return {
            "wake_up": "NOTIFY" if hints else "fallback poll only (notify=false, poll_interval=1.0)",
            "samples": len(latencies),
            "sent": sent,
            "p50_ms": _ms(_percentile(latencies, 0.5)),
            "p99_ms": _ms(_percentile(latencies, 0.99)),
            "max_ms": _ms(max(latencies)),
        }

    def bench_latency(self) -> list[dict[str, Any]]:
        duration = 3 if self.quick else 10
        return [
            self.latency(hints=True, rate=100, duration=duration, topics=10),
            self.latency(hints=False, rate=10, duration=duration * 2, topics=10),
        ]

    # -- catch-up ------------------------------------------------------------------------------

    def bench_catch_up(self) -> list[dict[str, Any]]:
        from api.core.durable_stream import DurableStreamRecord

        count = 20_000 if self.quick else 100_000
        rows = []
        with self.connect() as backend:
            name = f"catchup-{uuid.uuid4().hex}"
            backend.topic(name).append(self.payload)
            # Filled in bulk with the rows appends would have written (same tables, same shape):
            # appending 100k records one by one would dominate the run time and is measured above.
            with self.psycopg_connect() as conn:
                conn.execute(
                    f"""WITH t AS (
                            UPDATE "{self.schema}".topics SET last_seq = last_seq + %(n)s WHERE name = %(name)s
                            RETURNING id, last_seq - %(n)s AS before)
                        INSERT INTO "{self.schema}".records (topic_id, seq, payload)
                        SELECT t.id, t.before + g, %(payload)s FROM t, generate_series(1, %(n)s) AS g""",
                    {"n": count - 1, "name": name, "payload": self.payload},
                )
                conn.execute(f'VACUUM ANALYZE "{self.schema}".records')
        for buffer_size in (128, 1024):
            with self.connect(buffer_size=buffer_size) as backend:
                started = time.perf_counter()
                received = 0
                with backend.topic(name).subscribe_from_beginning() as subscription:
                    while received < count:
                        record = subscription.receive(timeout=5)
                        if not isinstance(record, DurableStreamRecord):
                            raise RuntimeError(f"catch-up stalled after {received} records: {record!r}")
                        received += 1
                elapsed = time.perf_counter() - started
            rows.append(
                {"records": count, "buffer_size": buffer_size, "records_per_s": round(count / elapsed), "s": elapsed}
            )
        return rows

    # -- fan-out -------------------------------------------------------------------------------

    def bench_fanout(self) -> dict[str, Any]:
        subscriptions, topics = (400, 40) if self.quick else (2000, 200)
        rate, duration, pool_size = 50.0, (4 if self.quick else 20), 8
        app = f"ds-bench-{uuid.uuid4().hex[:8]}"
        names = [f"fanout-{uuid.uuid4().hex}" for _ in range(topics)]
        with self.connect() as setup:
            for name in names:
                setup.topic(name).subscribe_from_tail().close()  # topics exist before the readers start
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from gevent import monkey; monkey.patch_all()\n"
                "import sys; from bench.postgres import fanout_child; fanout_child(sys.argv[1:])",
                self.url,
                self.schema,
                app,
                str(subscriptions),
                str(pool_size),
                *names,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        ready = child.stdout.readline().strip()
        if ready != "ready":
            child.kill()
            raise RuntimeError(f"fan-out child failed to start: {ready!r}")
        peak = 0
        stop_sampling = threading.Event()

        def sample_connections() -> None:
            nonlocal peak
            with self.psycopg_connect() as conn:
                while not stop_sampling.is_set():
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
                    ).fetchone()
                    peak = max(peak, int(row[0]))  # type: ignore[index]
                    time.sleep(0.1)

        sampler = threading.Thread(target=sample_connections)
        sampler.start()
        with self.connect() as writer:
            sent = append_timestamps(writer, names, duration, rate)
        output, _ = child.communicate(timeout=120)
        stop_sampling.set()
        sampler.join()
        stats = json.loads(output.strip().splitlines()[-1])
        per_topic = subscriptions // topics
        return {
            "subscriptions": subscriptions,
            "topics": topics,
            "runtime": "gevent (monkey-patched), one process",
            "appends": sent,
            "append_rate_per_s": rate,
            "expected_deliveries": sent * per_topic,
            "deliveries": stats["deliveries"],
            "p50_ms": stats["p50_ms"],
            "p99_ms": stats["p99_ms"],
            "max_ms": stats["max_ms"],
            "pool_size": pool_size,
            "peak_connections": peak,
        }

    # -- driver --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        import psycopg
        import sqlalchemy

        results: dict[str, Any] = {
            "adapter": "postgresql",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "quick": self.quick,
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "psycopg": psycopg.__version__,
                "sqlalchemy": sqlalchemy.__version__,
                "load_average_at_start": os.getloadavg(),
            },
            "server": self.server_facts(),
            "payload_bytes": PAYLOAD_SIZE,
        }
        self.connect().close()  # creates the schema and the adapter's tables
        try:
            for key, scenario in (
                ("append", self.bench_append),
                ("latency", self.bench_latency),
                ("catch_up", self.bench_catch_up),
                ("fanout", self.bench_fanout),
            ):
                print(f"... {key}", file=sys.stderr, flush=True)
                results[key] = scenario()
        finally:
            self.drop_schema()
        results["machine"]["load_average_at_end"] = os.getloadavg()
        return results


def fanout_child(argv: list[str]) -> None:
    """Runs in a gevent-patched child: many subscriptions, latencies reported as JSON on stdout."""
    from api.core.durable_stream import connect

    url, schema, app, count, pool_size, *names = argv
    backend = connect(url, schema=schema, application_name=app, pool_size=int(pool_size))
    # Past the start-up reads (each new subscription's first read, the wake after LISTEN, the first
    # fallback poll).
    latencies = follow_timestamps(backend, names, int(count), settle=2.5)
    backend.close()
    print(
        json.dumps(
            {
                "deliveries": len(latencies),
                "p50_ms": _ms(_percentile(latencies, 0.5)),
                "p99_ms": _ms(_percentile(latencies, 0.99)),
                "max_ms": _ms(max(latencies, default=0.0)),
            }
        ),
        flush=True,
    )


def _table(results: dict[str, Any]) -> str:
    lines = [f"PostgreSQL adapter benchmarks ({results['date']}, {results['machine']['cpus']} CPUs)", ""]
    lines.append("append (records/s)                 adapter  raw INSERT   ratio")
    for row in results["append"]:
        label = f"{row['producers']} producer(s), {row['topics']} topic(s)"
        lines.append(
            f"  {label:<30}{row['adapter_records_per_s']:>10}{row['raw_insert_records_per_s']:>12}{row['ratio']:>8}"
        )
    lines.append("")
    lines.append("latency append -> receive      p50 ms    p99 ms    max ms   samples")
    for row in results["latency"]:
        label = "NOTIFY" if row["wake_up"] == "NOTIFY" else "poll fallback only"
        lines.append(f"  {label:<28}{row['p50_ms']:>8}{row['p99_ms']:>10}{row['max_ms']:>10}{row['samples']:>10}")
    lines.append("")
    lines.append("catch-up (one subscription)")
    for row in results["catch_up"]:
        lines.append(f"  {row['records']} records, buffer_size {row['buffer_size']}: {row['records_per_s']} records/s")
    lines.append("")
    fan = results["fanout"]
    lines.append(
        f"fan-out: {fan['subscriptions']} subscriptions on {fan['topics']} topics ({fan['runtime']}), "
        f"{fan['appends']} appends at ~{fan['append_rate_per_s']:.0f}/s"
    )
    lines.append(
        f"  connections {fan['peak_connections']} (pool_size {fan['pool_size']} + 1 hint connection), "
        f"deliveries {fan['deliveries']}/{fan['expected_deliveries']}, "
        f"p50 {fan['p50_ms']} ms, p99 {fan['p99_ms']} ms, max {fan['max_ms']} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("BENCH_POSTGRES_URL", DEFAULT_URL))
    parser.add_argument("--quick", action="store_true", help="smaller counts, one round (a smoke run)")
    parser.add_argument("--output", type=pathlib.Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    results = Bench(args.url, args.quick).run()
    print(_table(results))
    args.output.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if args.quick else ""
    path = args.output / f"postgres-{datetime.date.today().isoformat()}{suffix}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
