"""How long to wait before the next attempt, and when to give up.

Exponential backoff with jitter: the n-th consecutive failed attempt waits a random time between
half and all of ``min(max_delay, base * multiplier ** (n - 1))``. The base is ``initial_delay``
unless the server sent an SSE ``retry:`` field (its reconnection time, in milliseconds), which
replaces it, as it does for a browser's ``EventSource``. A ``Retry-After`` of a 503 is a floor,
itself spread over up to half again as long (every client of a busy server is told the same).

The budget counts *consecutive* failures: a connection that delivered anything (an event or a
ping) resets it, so a long run that is cut many times goes on as long as each connection is
useful, while a server that is down is given up after ``max_attempts`` tries (or ``max_elapsed``
seconds since the first of them).
"""

from __future__ import annotations

import dataclasses
import random
import time


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    #: Consecutive failed attempts after which the client gives up (the first try counts as one).
    max_attempts: int = 8
    #: Seconds since the first of a run of consecutive failures after which the client gives up.
    max_elapsed: float = 120.0
    #: The first wait, in seconds (unless the server's ``retry:`` says otherwise).
    initial_delay: float = 0.25
    multiplier: float = 2.0
    #: No wait is longer than this (a ``Retry-After`` may be).
    max_delay: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 0 or self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise ValueError(f"invalid retry policy: {self}")


class Backoff:
    """The retry state of one stream or request."""

    def __init__(self, policy: RetryPolicy, rng: random.Random | None = None) -> None:
        self.policy = policy
        self.failures = 0
        #: The server's reconnection time (``retry:``), in seconds, once it sent one.
        self.server_retry: float | None = None
        self._first_failure: float | None = None
        self._rng = rng or random.Random()

    def succeeded(self) -> None:
        """The last attempt was useful: the next failure starts a new count."""
        self.failures = 0
        self._first_failure = None

    def next_delay(self, retry_after: float | None = None) -> float | None:
        """Record a failed attempt; the seconds to wait before the next one, or ``None`` to give up."""
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        self.failures += 1
        policy = self.policy
        if self.failures >= policy.max_attempts or now - self._first_failure > policy.max_elapsed:
            return None
        base = policy.initial_delay if self.server_retry is None else self.server_retry
        ceiling = min(policy.max_delay, base * policy.multiplier ** (self.failures - 1))
        delay = self._rng.uniform(ceiling / 2, ceiling)
        if retry_after is not None:
            # Up to half again as long: a herd that was told the same Retry-After comes back spread.
            delay = max(delay, retry_after * self._rng.uniform(1.0, 1.5))
        return delay
