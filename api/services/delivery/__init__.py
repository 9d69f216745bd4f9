"""Delivery: everything one event-stream response needs below the HTTP edge.

Where a reader starts (cursor, tail, snapshot) and what it reads (:mod:`.streams`), the rules it
reads by (``api.core.app.apps.read_loop``, driven by the per-client reader and by the shared
writer), the run watch (:mod:`.watcher`), the shared writer (:mod:`.writer`) and the ending lane
(:mod:`.endings`), and the per-process :mod:`.runtime` that holds them. The HTTP edge parses and
authorises a request, calls :func:`run_streaming` or :func:`reconnect`, and hands in a
:class:`~.framing.Framer` (SSE, resume tokens) for the bytes.
"""

from __future__ import annotations

from .body import shared_body, writable_socket
from .framing import Framer
from .runtime import DeliveryRuntime, current_runtime
from .streams import EventStream, RunIds, reconnect, resumable, run_headers, run_streaming
from .writer import Arrival

__all__ = [
    "Arrival",
    "DeliveryRuntime",
    "EventStream",
    "Framer",
    "RunIds",
    "current_runtime",
    "reconnect",
    "resumable",
    "run_headers",
    "run_streaming",
    "shared_body",
    "writable_socket",
]
