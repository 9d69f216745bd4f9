"""The shared contract suite every durable-stream adapter must pass, ours and anyone else's.

One base class per capability; :class:`DurableStreamContract` combines them. An adapter's test
module subclasses it once (``class TestSqliteContract(DurableStreamContract)``) and implements
``make_backend(**options)`` (and ``backend_url(**options)`` where another process can reach the
same store); an adapter written outside this repository does the same (``docs/contract.md``, "An
adapter of your own"). Nothing in this package is collected by itself: its classes do not start
with ``Test``, and it needs pytest and hypothesis, which only tests import.
"""

from __future__ import annotations

from .append_order import AppendOrderContract
from .backpressure import BackpressureContract
from .close_threads import CloseAndThreadsContract
from .cursor_resume import CursorResumeContract
from .errors import ErrorMappingContract
from .history import HistoryContract
from .ordinal_cursors import OrdinalCursorContract
from .retention import RetentionContract
from .seal import SealContract
from .start_positions import StartPositionContract
from .stateful import StatefulContract

__all__ = [
    "AppendOrderContract",
    "BackpressureContract",
    "CloseAndThreadsContract",
    "CursorResumeContract",
    "DurableStreamContract",
    "ErrorMappingContract",
    "HistoryContract",
    "OrdinalCursorContract",
    "RetentionContract",
    "SealContract",
    "StartPositionContract",
    "StatefulContract",
]


class DurableStreamContract(
    AppendOrderContract,
    StartPositionContract,
    CursorResumeContract,
    RetentionContract,
    SealContract,
    CloseAndThreadsContract,
    BackpressureContract,
    ErrorMappingContract,
    OrdinalCursorContract,
    HistoryContract,
    StatefulContract,
):
    """Every capability of the contract; subclass once per adapter."""
