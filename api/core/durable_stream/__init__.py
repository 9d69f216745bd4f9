"""Durable streams: ordered, retained, resumable per-topic logs.

Workers append records to a topic; any number of independent subscriptions read it from the
beginning, from the tail, or strictly after a cursor returned with an earlier record::

    from api.core.durable_stream import CLOSED, connect

    with connect("sqlite:///var/streams.db") as backend:
        topic = backend.topic("workflow:run-42")
        topic.append(b'{"event": "workflow_started"}')
        with topic.subscribe_from_beginning() as subscription:
            record = subscription.receive(timeout=1.0)
        # ... later, after a disconnect:
        with topic.subscribe_from_cursor(record.cursor) as subscription:
            while (next_record := subscription.receive(timeout=1.0)) is not CLOSED:
                ...

The contract lives in :mod:`._contract`; adapters are chosen by URL scheme in :func:`connect` and
live in :mod:`.adapters` (``memory``, ``sqlite``, ``redis``, ``postgres``, ``nats``), one sub-package each whose
docstring is its capability card (rendered to ``docs/adapters/`` by ``make docs``).

Metrics hooks: :func:`set_observer` registers a :class:`DurableStreamObserver` (see
:mod:`._observer`) that every backend connected afterwards reports appends, reads, subscriptions
and errors to; none is set by default, and the library depends on no metrics package.
"""

from __future__ import annotations

from ._backend import DurableStreamAdmin, DurableStreamBackend
from ._connect import adapter_name, connect
from ._contract import (
    CLOSED,
    Closed,
    CursorUnavailableError,
    DurableStreamError,
    DurableStreamProducer,
    DurableStreamRecord,
    DurableStreamSubscription,
    DurableStreamTopic,
    DurableStreamUnavailableError,
    TopicCursor,
    TopicSealedError,
)
from ._cursor import CursorPosition
from ._driver import TopicInfo
from ._observer import DurableStreamObserver, current_observer, set_observer
from ._producer import RepairingProducer

__all__ = [
    "CLOSED",
    "Closed",
    "CursorPosition",
    "CursorUnavailableError",
    "DurableStreamAdmin",
    "DurableStreamBackend",
    "DurableStreamError",
    "DurableStreamObserver",
    "DurableStreamProducer",
    "DurableStreamRecord",
    "DurableStreamSubscription",
    "DurableStreamTopic",
    "DurableStreamUnavailableError",
    "RepairingProducer",
    "TopicCursor",
    "TopicInfo",
    "TopicSealedError",
    "adapter_name",
    "connect",
    "current_observer",
    "set_observer",
]
