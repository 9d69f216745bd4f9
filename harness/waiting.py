"""Waiting on a deadline for a condition, instead of sleeping for a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until[T](check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
