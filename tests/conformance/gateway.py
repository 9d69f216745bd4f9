"""The gateway under gunicorn (gevent) on a free port, and the conformance suite run against it.

``python -m tests.conformance.gateway [adapter ...]`` (``make test-conformance``) runs the suite against
the gateway on each adapter (default: memory, sqlite, redis, postgres, nats) and prints the counts.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from harness.app_env import base_env
from harness.nats_server import NatsServer
from harness.processes import process_env
from harness.served_stack import GunicornServer
from harness.services import postgres_dsn, redis_url

HERE = pathlib.Path(__file__).resolve().parent
ADAPTERS = ("memory", "sqlite", "redis", "postgres", "nats")
#: Long-polls in the suite wait this long on the gateway (the suite's own timeout is 1 s more).
LONG_POLL_SECONDS = 3
#: gunicorn's ``--keep-alive``, as docs/gateway.md runs it: longer than Node's fetch keeps an idle
#: connection (4 s), so the client, never the server, closes idle connections. With gunicorn's default
#: of 2 s a request sent after a pause of about 2 s (the suite's TTL tests pause 1.5 s, longer on a busy
#: machine) could meet a connection the server was closing, and the body of a refused (413) 10 MB append,
#: which gunicorn reads and discards before the connection's next request, had 2 s to arrive: both
#: "fetch failed".
KEEP_ALIVE_SECONDS = 10
#: The longest one vitest run may take (the suite runs its files one after another, its TTL tests pause).
VITEST_SECONDS = 600


@contextlib.contextmanager
def adapter_store(adapter: str, var_dir: pathlib.Path) -> Iterator[str]:
    """The stream URL of ``adapter`` for one test; NATS gets a private server (the shared one may be too old)."""
    if adapter != "nats":
        yield adapter_url(adapter, var_dir)
        return
    (var_dir / "nats").mkdir(parents=True, exist_ok=True)
    server = NatsServer(directory=var_dir / "nats").start()
    try:
        yield server.url
    finally:
        server.stop()


def adapter_url(adapter: str, var_dir: pathlib.Path) -> str:
    if adapter == "memory":
        return "memory://"
    if adapter == "sqlite":
        return f"sqlite:///{var_dir / 'streams.db'}"
    if adapter == "redis":
        # A key prefix of its own, as PostgreSQL gets a schema: a retention sweep scans this test's keys
        # only, not everything earlier runs left in the shared server.
        return redis_url(7, f"key_prefix=gw-{uuid.uuid4().hex[:10]}:")
    if adapter == "postgres":
        return postgres_dsn("postgresql", f"schema=gw_{uuid.uuid4().hex[:10]}")
    if adapter == "nats":
        return "nats://127.0.0.1:4222"
    raise ValueError(f"unknown adapter {adapter!r}")


class GatewayServer(GunicornServer):
    """``gunicorn -k gevent api.durable_streams_app:app`` with one worker, on a free port, as docs/gateway.md
    runs it (gunicorn's own settings, not the API's config module)."""

    def __init__(self, stream_url: str, var_dir: pathlib.Path, **settings: Any) -> None:
        var_dir.mkdir(parents=True, exist_ok=True)
        env = base_env(
            var_dir,
            DURABLE_STREAM_URL=stream_url,
            DURABLE_STREAM_MAX_AGE_SECONDS=0,
            DURABLE_STREAMS_GATEWAY_LONG_POLL_SECONDS=LONG_POLL_SECONDS,
            LOG_FORMAT="text",
            **settings,
        )
        super().__init__(
            env,
            var_dir,
            workers=1,
            name="gateway",
            access_log=False,
            app="api.durable_streams_app:app",
            config=None,
            extra_args=("--keep-alive", str(KEEP_ALIVE_SECONDS)),
            ready_path="/health-probe",
        )
        self.base_url = self.url


def run_vitest(
    base_url: str, output: pathlib.Path, test_file: str = "conformance.test.mjs", env: Mapping[str, str] = {}
) -> dict[str, Any]:
    """Run one vitest file against ``base_url``; return vitest's parsed JSON report."""
    npx = shutil.which("npx") or "npx"
    command = [npx, "vitest", "run", "--config", "vitest.config.mjs", test_file]
    command += ["--reporter=json", f"--outputFile={output}"]
    subprocess.run(
        command,
        cwd=HERE,
        env={
            **process_env({}),
            "DURABLE_STREAMS_BASE_URL": base_url,
            "DURABLE_STREAMS_LONG_POLL_MS": str(LONG_POLL_SECONDS * 1000),
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=VITEST_SECONDS,
        check=False,
    )
    report: dict[str, Any] = json.loads(output.read_text())
    return report


def failures(report: Mapping[str, Any]) -> list[str]:
    return [
        f"{result['fullName']}: {(result.get('failureMessages') or [''])[0][:300]}"
        for file in report["testResults"]
        for result in file["assertionResults"]
        if result["status"] == "failed"
    ]


def counts(report: Mapping[str, Any]) -> tuple[int, int, int, int]:
    return (
        report["numPassedTests"],
        report["numFailedTests"],
        report["numPendingTests"] + report.get("numTodoTests", 0),
        report["numTotalTests"],
    )


def main(adapters: list[str]) -> int:
    worst = 0
    for adapter in adapters or list(ADAPTERS):
        with tempfile.TemporaryDirectory(prefix=f"gateway-{adapter}-") as folder:
            var_dir = pathlib.Path(folder)
            started = time.monotonic()
            with (
                adapter_store(adapter, var_dir) as url,
                GatewayServer(url, var_dir, DURABLE_STREAMS_GATEWAY_ANONYMOUS="true") as gw,
            ):
                report = run_vitest(gw.base_url, var_dir / "report.json")
            passed, failed, skipped, total = counts(report)
            print(f"{adapter}: {passed} passed, {failed} failed, {skipped} skipped of {total} ", end="")
            print(f"({time.monotonic() - started:.0f} s)")
            for line in failures(report):
                print(f"  FAILED {line}")
            worst = max(worst, 1 if failed else 0)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
