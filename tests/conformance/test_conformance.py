"""The Durable Streams server conformance suite (npm, pinned) against the gateway on SQLite.

The gateway runs as it is deployed: gunicorn with a gevent worker on a free port. ``make
test-conformance`` runs the same suite on every adapter; docs/conformance.md lists the counts.
"""

from __future__ import annotations

import pathlib

import pytest

from .gateway import VITEST_SECONDS, GatewayServer, adapter_url, counts, failures, run_vitest

# A guard against a hang, not a speed limit: the suite's own deadline, and a minute to start and stop the gateway.
pytestmark = [pytest.mark.timeout(VITEST_SECONDS + 60), pytest.mark.slow]

#: The reference server (@durable-streams/server 0.3.7) passes 324 of the 338 here, skipping 6.
REFERENCE_PASSED = 324


def test_the_gateway_on_sqlite_passes_the_conformance_suite(tmp_path: pathlib.Path) -> None:
    with GatewayServer(adapter_url("sqlite", tmp_path), tmp_path, DURABLE_STREAMS_GATEWAY_ANONYMOUS="true") as gw:
        report = run_vitest(gw.base_url, tmp_path / "report.json")
    passed, failed, _skipped, total = counts(report)
    assert total == 338
    assert failures(report) == []
    assert failed == 0
    assert passed >= REFERENCE_PASSED
