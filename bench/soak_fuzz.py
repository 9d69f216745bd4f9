"""Soak the HTTP API with hostile input over real sockets, on a SQLite and a PostgreSQL app database.

Run ``.venv/bin/python -m bench.soak_fuzz`` (``--cases N``, default 10,000 per database). For each
app database it starts what ``make run`` starts (``gunicorn -k gevent`` with two workers and a Celery
worker, here on the Redis broker the tests use; PostgreSQL in a private schema of the ``test``
database, dropped afterwards), makes genuine runs and resume tokens through the API, then sends the
cases of :mod:`harness.hostile` from several client threads with http.client.

It prints a markdown table per database (case kind by answer status, 5xx, wrongly accepted, other
problems), the wall time, and whether both databases answered every case the same; the exit status is
1 if any answer was a 5xx, a wrong acceptance or otherwise not the one required, or if they differ.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from api.app_factory import create_app
from api.configs import AppConfig
from api.models.engine import db
from harness.app_database import APP_DATABASES, app_database_uri
from harness.app_env import base_env
from harness.hostile import Case, generate_cases
from harness.hostile_check import Report, run_cases
from harness.hostile_target import FAST_WORKFLOW, build_target
from harness.http_transport import Answer, HttpTransport
from harness.processes import BIN, ROOT, process_env, running_worker
from harness.served_stack import GunicornServer

DEFAULT_CASES = 10_000
DEFAULT_SEED = 20261201


def soak(database: str, count: int, seed: int, clients: int, work_dir: pathlib.Path) -> tuple[Report, int]:
    """Run ``count`` cases against a fresh server on ``database``; returns the report and the server's tracebacks."""
    var_dir = work_dir / database
    var_dir.mkdir(parents=True)
    with app_database_uri(database, var_dir) as uri:
        env = base_env(var_dir, SQLALCHEMY_DATABASE_URI=uri)
        _create_tables(env)
        with running_worker(env, var_dir / "worker.log"), GunicornServer(env, var_dir) as server:
            transport = HttpTransport("127.0.0.1", server.port)
            config = AppConfig(**env)  # type: ignore[arg-type]
            target = build_target(
                transport,
                _create_workflow_app(env),
                _create_workflow_app(env),
                max_body_bytes=config.MAX_REQUEST_BODY_BYTES,
                max_json_depth=config.MAX_JSON_DEPTH,
            )
            transport.close()
            cases = generate_cases(target, count, seed)

            def deliver(case: Case) -> Answer:
                return transport.send(case.request)

            started = time.perf_counter()
            report = run_cases(cases, deliver, Report(database), clients=clients)
            report.wall_time = time.perf_counter() - started
        tracebacks = server.log_path.read_text(errors="replace").count("Traceback (most recent call last)")
    return report, tracebacks


def _create_tables(env: dict[str, str]) -> None:
    # Before three processes race to; the engine is let go so a private schema can be dropped later.
    app = create_app(AppConfig(**env))  # type: ignore[arg-type]
    with app.app_context():
        db.engine.dispose()


def _create_workflow_app(env: dict[str, str]) -> dict[str, str]:
    created = subprocess.run(
        [str(BIN / "flask"), "--app", "api.app", "create-app", "--file", "/dev/stdin"],
        input=json.dumps(FAST_WORKFLOW),
        cwd=ROOT,
        env=process_env(env),
        capture_output=True,
        text=True,
        check=True,
    )
    app: dict[str, str] = json.loads(created.stdout)
    return app


def _summary(report: Report, tracebacks: int) -> str:
    total = sum(report.counts.values())
    rate = total / report.wall_time if report.wall_time else 0.0
    return (
        f"### {report.label}: {total} cases in {report.wall_time:.1f} s ({rate:.0f} cases/s)\n\n"
        f"{report.markdown()}\n\n"
        f"5xx: {report.server_errors}; wrongly accepted: {report.wrongly_accepted}; "
        f"other problems: {len(report.problems) - report.server_errors - report.wrongly_accepted}; "
        f"tracebacks in the gunicorn log: {tracebacks}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=DEFAULT_CASES, help="cases per database (default 10,000)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--clients", type=int, default=4, help="client threads sending cases")
    parser.add_argument("--databases", default=",".join(APP_DATABASES), help="comma-separated app databases")
    args = parser.parse_args(argv)

    reports = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="soak-fuzz-") as work_dir:
        for database in args.databases.split(","):
            report, tracebacks = soak(database, args.cases, args.seed, args.clients, pathlib.Path(work_dir))
            reports.append(report)
            print(_summary(report, tracebacks) + "\n", flush=True)
            if report.problems:
                print(report.describe_problems() + "\n", flush=True)
            failed = failed or bool(report.problems) or tracebacks > 0
    for first, second in itertools.pairwise(reports):
        differing = first.differences(second)
        verdict = "identical" if not differing else f"{len(differing)} differ, e.g. cases {differing[:10]}"
        print(f"{first.label} vs {second.label}: answers (kind, status, code) of {len(first.answers)} cases {verdict}")
        failed = failed or bool(differing)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
