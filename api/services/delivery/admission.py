"""Admission: a worker that cannot take another event stream says so before doing any work for it.

A herd (every client of every live run reconnecting after a deploy) must not turn into streams that
each start, read their run and then time out, nor degrade every stream the worker already serves. A
stream is refused with 503 ``server_busy`` and a ``Retry-After`` when

- ``max_streams`` of this process's admitted streams are open (set below the connections one worker
  accepts, so that a full worker can still answer, not leave the rest waiting in the listen backlog);
  the refused come back after a ``Retry-After`` spread over ``retry_after_max`` to :data:`MAX_RETRY_AFTER`
  seconds, since room frees only as streams end;
- more than ``max_rate`` streams a second arrive (a token bucket holding one second of arrivals):
  past what one worker can start while it keeps delivering to the streams it has, every start slows
  every stream. Each refused client is told to come back at its own turn after the clients already
  refused (a queue of ``1 / max_rate`` s slots), so the refused come back at the rate the worker can
  take rather than all at once, and are served then;
- ``max_starting`` streams of this process are still starting (between their request and their
  first bytes: the token, the run's row, the subscription or the wait for the run's writer); or
- the process's event loop is ``max_lag`` seconds or more behind (measured under gevent by a
  greenlet that asks to wake every :data:`PROBE_INTERVAL` and notes how late it wakes, twice in a
  row). These two refuse with a ``Retry-After`` spread over ``1..retry_after_max`` seconds (longer,
  up to twice the loop's lag, when it is further behind).

Refusals are counted (``workflow_sse_admission_refused_total{reason}``).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from api.libs import metrics
from api.libs.errors import ServerBusyError

#: Seconds between the loop-lag probe's wake-ups.
PROBE_INTERVAL = 0.25
#: The longest Retry-After a refusal carries, however far behind the loop is.
MAX_RETRY_AFTER = 30
BUSY_MESSAGE = "this API worker is at capacity; try again after the time Retry-After gives"


class Admission:
    """This process's gate for new event streams. Used from the request's greenlet or thread."""

    def __init__(
        self,
        *,
        max_starting: int,
        max_lag: float,
        retry_after_max: int,
        max_rate: float = 0.0,
        max_streams: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_starting = max_starting
        self._max_lag = max_lag
        self._retry_after_max = max(retry_after_max, 1)
        self._max_rate = max_rate
        self._clock = clock
        #: Arrivals the bucket admits now (refilled at ``max_rate`` a second, up to one second's worth).
        self._tokens = max_rate
        self._filled_at = clock()
        #: When the last refused client was told to come back (its slot in the queue of the refused).
        self._queue_end = 0.0
        self.starting = 0
        #: The most admitted streams open at once (0: no limit), and how many are open.
        self.max_streams = max_streams
        self.open = 0
        #: How far behind the event loop was at the probe's last wake-up, in seconds.
        self.lag = 0.0
        self._probe: object | None = None

    @contextlib.contextmanager
    def start(self) -> Iterator[None]:
        """Admit one stream for its start (the ``with`` block), or refuse it.

        Raises:
            ServerBusyError: (503 ``server_busy``) too many streams are open, arriving or starting, or the
                loop is behind.
        """
        self._ensure_probe()
        if self.max_streams and self.open >= self.max_streams:
            metrics.ADMISSION_REFUSED.tally.add(("streams",))
            raise ServerBusyError(
                BUSY_MESSAGE,
                retry_after=random.randint(self._retry_after_max, max(self._retry_after_max, MAX_RETRY_AFTER)),
            )
        if self._max_rate and not self._take_token():
            metrics.ADMISSION_REFUSED.tally.add(("rate",))
            raise ServerBusyError(BUSY_MESSAGE, retry_after=self._turn())
        reason = None
        if self._max_starting and self.starting >= self._max_starting:
            reason = "starting"
        elif self._max_lag and self.lag >= self._max_lag:
            reason = "loop_lag"
        if reason is not None:
            metrics.ADMISSION_REFUSED.tally.add((reason,))
            # The further behind, the longer the spread: refusals cost the loop too, and a herd told
            # to come back within seconds would keep it behind.
            longest = max(self._retry_after_max, min(MAX_RETRY_AFTER, math.ceil(2 * self.lag)))
            raise ServerBusyError(BUSY_MESSAGE, retry_after=random.randint(1, longest))
        self.starting += 1
        try:
            yield
        finally:
            self.starting -= 1

    def holding(self, body: Iterable[Any]) -> Iterable[Any]:
        """``body`` (an admitted stream's response body), counted as open until the server closes it."""
        return _Counted(self, body)

    def _take_token(self) -> bool:
        now = self._clock()
        self._tokens = min(self._max_rate, self._tokens + (now - self._filled_at) * self._max_rate)
        self._filled_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _turn(self) -> int:
        """Seconds until a refused client's turn: one slot of ``1 / max_rate`` s after the last one
        given (and at least a second from now, when the bucket has room again)."""
        now = self._clock()
        self._queue_end = max(self._queue_end, now + 1.0) + 1.0 / self._max_rate
        return min(MAX_RETRY_AFTER, math.ceil(self._queue_end - now))

    def _ensure_probe(self) -> None:
        """Start the loop-lag probe in this process (on first use: never inherited across a fork)."""
        if self._probe is not None or not self._max_lag or not _gevent_patched():
            return
        import gevent

        self._probe = gevent.spawn(self._measure)

    def _measure(self) -> None:
        import gevent

        previous = 0.0
        while True:
            asked = time.monotonic()
            gevent.sleep(PROBE_INTERVAL)
            late = max(time.monotonic() - asked - PROBE_INTERVAL, 0.0)
            # The smaller of two wake-ups in a row: one long stall (a full garbage collection, a slow
            # import) is behind the loop already; a loop that stays behind is what refuses streams.
            self.lag, previous = min(late, previous), late


def _gevent_patched() -> bool:
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        return False
    return bool(monkey.is_module_patched("socket"))


class _Counted:
    """An admitted stream's body: one more open stream until it is closed (once), started or not."""

    __slots__ = ("_admission", "_body", "_iterator")

    def __init__(self, admission: Admission, body: Iterable[Any]) -> None:
        self._admission = admission
        self._body: Iterable[Any] | None = body
        self._iterator = iter(body)
        admission.open += 1

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        return next(self._iterator)

    def close(self) -> None:
        body, self._body = self._body, None
        if body is None:
            return
        self._admission.open -= 1
        close = getattr(body, "close", None)
        if close is not None:
            close()
