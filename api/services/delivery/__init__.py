"""Delivery: everything one event-stream response needs below the HTTP edge.

The HTTP edge parses and authorises a request, turns it into a :class:`StreamRequest` and hands it
to :meth:`DeliveryRuntime.open_stream` (the process's :mod:`.runtime`), which decides how the client
is delivered: by its run's shared writer (:mod:`.writer`, :mod:`.clients`) or alone (:mod:`.alone`),
both reading by one loop and its rules (:mod:`.reading`); the run watch (:mod:`.watcher`) ends the
streams of runs that will not end on their own. The edge hands in a :class:`~.framing.Framer` (SSE,
resume tokens) for the bytes.
"""

from __future__ import annotations

from .alone import resumable, run_headers
from .clients import writable_socket
from .framing import Framer
from .runtime import DeliveryRuntime, StreamRequest, current_runtime

__all__ = [
    "DeliveryRuntime",
    "Framer",
    "StreamRequest",
    "current_runtime",
    "resumable",
    "run_headers",
    "writable_socket",
]
