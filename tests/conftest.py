"""Session-wide test configuration.

``make test`` runs the durable-stream contract suite twice: once in plain threads and once under
``python -m gevent.monkey --module pytest`` with ``EXPECT_GEVENT=1``, which makes sure the second
run really is monkey-patched rather than silently repeating the first.
"""

from __future__ import annotations

import os

import pytest

from api.core.durable_stream._cooperative import gevent_active


def pytest_report_header(config: pytest.Config) -> str:
    return f"gevent monkey-patching: {'active' if gevent_active() else 'off'}"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("EXPECT_GEVENT") == "1" and not gevent_active():
        raise pytest.UsageError("EXPECT_GEVENT=1 but gevent has not patched threading")
