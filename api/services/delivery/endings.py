"""Ending the responses that shared writers let go of, off the delivery path (gevent workers only).

A client a writer ends has all its bytes already, but its response still has to end: gunicorn's
last chunk, its access-log line, the app context's teardown, the socket's close. That costs far
more than writing an event, and a run's end ends all its clients at once: woken together, a few
thousand endings would delay the next events of every other run in the process by as long as
they take (``docs/benchmarks.md``, "Ending responses off the delivery path"). An :class:`EndingLane`
wakes them :data:`BATCH` at a time whenever the hub's loop is idle, so the events due go first,
or after :data:`PATIENCE` seconds if it never is, so a saturated worker still closes its streams.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

#: Ended clients woken at a time.
BATCH = 32
#: The longest wait, in seconds, for an idle loop before the next batch is woken anyway.
PATIENCE = 0.1


class EndingLane:
    """The ended clients of one process, woken in order. Used from the hub's thread only."""

    def __init__(self, *, batch: int = BATCH, patience: float = PATIENCE) -> None:
        self._batch, self._patience = batch, patience
        self._waiting: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._greenlet: Any = None

    def add(self, switch: Callable[[Any], None], value: Any) -> None:
        """Have ``switch(value)`` run from the hub (a parked greenlet's ``Waiter.switch``) in its turn."""
        self._waiting.append((switch, value))
        if self._greenlet is None:
            import gevent

            self._greenlet = gevent.spawn(self._wake_all)

    def _wake_all(self) -> None:
        import gevent

        loop = gevent.get_hub().loop
        waiting = self._waiting
        try:
            while waiting:
                with gevent.Timeout(self._patience, False):
                    gevent.idle()  # the events due go first; the batch woken last time has run
                for _ in range(min(self._batch, len(waiting))):
                    loop.run_callback(*waiting.popleft())
        finally:
            self._greenlet = None
            while waiting:  # killed (the worker is stopping): nobody is left parked
                loop.run_callback(*waiting.popleft())
