"""Keep blocking C calls off the gevent hub.

Under gevent monkey-patching the API workers run many greenlets on one OS thread; a C call that
blocks (SQLite waiting on a lock or ``fsync``) would stall all of them. Such calls go through
gevent's native threadpool when ``threading`` is patched, and run inline everywhere else.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

__all__ = ["gevent_active", "run_blocking"]

T = TypeVar("T")


def gevent_active() -> bool:
    """Return whether gevent has patched ``threading`` in this process."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None:
        return False
    return bool(monkey.is_module_patched("threading"))


def run_blocking(fn: Callable[[], T]) -> T:
    """Run ``fn``, in gevent's threadpool when gevent is active, and return its result."""
    if not gevent_active():
        return fn()
    import gevent

    result: T = gevent.get_hub().threadpool.apply(fn)
    return result
