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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that hold a ``slow`` test first, each kept whole and in order: ``make test`` hands whole
    files to its processes (``--dist loadfile``) in this order, and a long file handed out last would
    keep one process busy after the others are done."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    order = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (item.path not in slow_files, order[id(item)]))
