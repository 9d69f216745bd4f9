"""What the contract suite observes from inside the library: where a reader blocks, who is registered
for wake-ups. Every adapter runs on the same engine, so these hold for an adapter written elsewhere."""

from __future__ import annotations

from typing import Any

from api.core.durable_stream import DurableStreamBackend, DurableStreamSubscription

from .._cooperative import gevent_active

__all__ = ["WAIT_FRAMES", "gevent_active", "is_waiting", "registered_topics"]

#: Where a subscription's thread blocks in ``receive()`` (plain threads): on its wake-up, or (Redis)
#: in the change feed links' ``select()`` while it reads the hints itself.
WAIT_FRAMES = frozenset({"ThreadWake.wait", "LinkReader._wait"})


def is_waiting(subscription: DurableStreamSubscription) -> bool:
    """Under gevent: whether a greenlet waits on the subscription's wake-up."""
    return bool(subscription._wake._waiters)  # type: ignore[attr-defined]


def registered_topics(backend: DurableStreamBackend) -> dict[str, Any]:
    """Topics with at least one registered waiting subscription (wake-up registrations)."""
    return dict(backend._engine.notifier._waiters)
