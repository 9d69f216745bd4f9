"""Session-wide test configuration.

``make test`` runs the durable-stream contract suite twice: once in plain threads and once under
``python -m gevent.monkey --module pytest`` with ``EXPECT_GEVENT=1``, which makes sure the second
run really is monkey-patched rather than silently repeating the first.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib

import pytest

from api.core.durable_stream._cooperative import gevent_active

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: Each test file's summed duration in the threaded run (make test-durations): the order files are handed out.
DURATIONS = ROOT / "tests" / "durations.json"
_durations: collections.Counter[str] = collections.Counter()


def pytest_report_header(config: pytest.Config) -> str:
    return f"gevent monkey-patching: {'active' if gevent_active() else 'off'}"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("EXPECT_GEVENT") == "1" and not gevent_active():
        raise pytest.UsageError("EXPECT_GEVENT=1 but gevent has not patched threading")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        action="store_true",
        help=f"write each test file's summed duration to {DURATIONS.relative_to(ROOT)} (make test-durations)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, each kept whole and in order: ``make test`` hands whole files to its
    processes (``--dist loadfile --no-loadscope-reorder``) in this order, and a long file handed out last
    keeps one process busy after the others are done. A file's length is its recorded duration; a file
    not recorded yet counts as the longest if it holds a ``slow`` test, else as the shortest."""
    recorded: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    longest = max(recorded.values(), default=0.0)
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def length(path: pathlib.Path) -> float:
        known = recorded.get(path.relative_to(ROOT).as_posix())
        return known if known is not None else longest if path in slow_files else 0.0

    order = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (-length(item.path), order[id(item)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid.partition("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Under xdist the controller sees every process's reports; a process of its own writes nothing.
    if session.config.getoption("record_durations") and not hasattr(session.config, "workerinput"):
        totals = {path: round(seconds, 1) for path, seconds in sorted(_durations.items())}
        DURATIONS.write_text(json.dumps(totals, indent=1) + "\n")
