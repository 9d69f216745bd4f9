"""The client's waits between attempts: backoff with jitter, and a 503's Retry-After as a floor that
is itself spread (every client of a busy server is told the same number)."""

from __future__ import annotations

import random

from durable_workflow_client.retry import Backoff, RetryPolicy


def test_a_retry_after_is_a_floor_spread_over_half_again_as_long() -> None:
    delays = [Backoff(RetryPolicy(initial_delay=0.01), random.Random(seed)).next_delay(4.0) for seed in range(300)]
    assert all(delay is not None and 4.0 <= delay <= 6.0 for delay in delays)
    spread = sorted(delay for delay in delays if delay is not None)
    assert spread[-1] - spread[0] > 1.5  # a herd told "4" comes back over two seconds, not at one instant


def test_without_retry_after_the_backoff_doubles_with_jitter_and_gives_up() -> None:
    backoff = Backoff(RetryPolicy(max_attempts=4, initial_delay=1.0, max_delay=10.0), random.Random(7))
    first, second, third = backoff.next_delay(), backoff.next_delay(), backoff.next_delay()
    assert first is not None and 0.5 <= first <= 1.0
    assert second is not None and 1.0 <= second <= 2.0
    assert third is not None and 2.0 <= third <= 4.0
    assert backoff.next_delay() is None  # the fourth failed attempt: given up
