"""Cooperation with gevent: blocking C calls off the hub, and cheap wake-ups for waiting subscriptions.

Under gevent monkey-patching the API workers run many greenlets on one OS thread; a C call that
blocks (SQLite waiting on a lock or ``fsync``) would stall all of them. Such calls go through
gevent's native threadpool when ``threading`` is patched, and run inline everywhere else.

Every waiting subscription blocks on a :class:`Wake` (the subset of ``threading.Event`` it uses),
made by :func:`new_wake`:

- In plain threads, a :class:`ThreadWake`: one lock, held while no wake-up is pending, that ``set``
  releases and ``wait`` acquires. ``threading.Event`` would cost its waiter an extra lock hand-over
  after every wake-up.
- Under gevent, a :class:`HubWake`: the patched ``Event.wait(timeout)`` arms a ``gevent.Timeout``
  whose expiry is an exception thrown into the waiting greenlet, which costs about three times the
  wake-up itself; an API worker with thousands of idle SSE streams would spend most of its CPU
  there. A ``HubWake`` parks a reused ``Waiter`` instead and leaves its timeout to one hub
  timer shared by every wake of the hub, armed for the earliest deadline (:class:`_Deadlines`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["HubWake", "ThreadWake", "Wake", "gevent_active", "new_wake", "run_blocking", "yield_to_greenlets"]


class Wake(Protocol):
    """What a subscription waits on: the subset of ``threading.Event`` it uses."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def gevent_active() -> bool:
    """Return whether gevent has patched ``threading`` in this process."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None:
        return False
    return bool(monkey.is_module_patched("threading"))


def run_blocking[T](fn: Callable[[], T]) -> T:
    """Run ``fn``, in gevent's threadpool when gevent is active, and return its result or raise its error."""
    if not gevent_active():
        return fn()
    import gevent

    outcome: T | _Raised = gevent.get_hub().threadpool.apply(_capturing, (fn,))
    if isinstance(outcome, _Raised):
        try:
            raise outcome.error
        finally:
            del outcome  # the traceback holds this frame: no cycle back to the error through it
    return outcome


class _Raised:
    """An error raised by a threadpool task, handed back as its result."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _capturing[T](fn: Callable[[], T]) -> T | _Raised:
    # gevent's hub prints a traceback to stderr for every error a threadpool task raises, even
    # when the caller expects and handles it (a sealed topic, a busy database file).
    try:
        return fn()
    except Exception as exc:
        return _Raised(exc)


def yield_to_greenlets() -> None:
    """Under gevent, let the other ready greenlets run before going on; nothing otherwise.

    For work that never waits on I/O (the memory store): a greenlet doing it in a loop would
    otherwise keep the hub to itself, and no other greenlet, a ``seal()`` included, would run.
    """
    if gevent_active():
        import gevent

        gevent.sleep(0)


def new_wake() -> Wake:
    """A wake-up flag for one waiter at a time: :class:`ThreadWake`, or :class:`HubWake` under gevent."""
    if gevent_active():
        return HubWake()
    return ThreadWake()


class ThreadWake:
    """``set``/``clear``/``wait(timeout)`` for one waiting OS thread at a time.

    A lock that is held while no wake-up is pending: ``set`` releases it (from any thread) and
    ``wait`` acquires it. ``threading.Event`` does the same with a condition, a fresh lock per wait
    and a deque of waiters, which costs its waiter an extra lock hand-over after every wake-up; on
    the delivery path that is measurable. A wake-up that nobody took is dropped by ``clear``, or
    makes the next ``wait`` return early with the flag unset, which the waiter treats as spurious.
    A second concurrent waiter is not woken by the same ``set`` (subscriptions never wait twice at
    once), and would return at its timeout.

    ``on_set`` is for a waiter that blocks elsewhere for a while (a change feed reading its socket
    in the waiter's thread): the callback runs after every ``set`` until it is removed again.
    """

    __slots__ = ("_flag", "_on_set", "_pending")

    def __init__(self) -> None:
        self._flag = False
        self._on_set: Callable[[], None] | None = None
        self._pending = threading.Lock()
        self._pending.acquire()

    def on_set(self, callback: Callable[[], None] | None) -> None:
        self._on_set = callback

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        self._flag = False
        self._pending.acquire(blocking=False)

    def set(self) -> None:
        self._flag = True
        # Every time, even with a wake-up pending: a waiter blocked elsewhere does not consume
        # the lock, which may stay released from a set() that raced a clear().
        callback = self._on_set
        if callback is not None:
            callback()
        try:  # on the delivery path: no context manager object per wake-up
            self._pending.release()
        except RuntimeError:  # released already: a wake-up is pending
            return

    def wait(self, timeout: float | None = None) -> bool:
        if not self._flag:
            self._pending.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))
        return self._flag


class HubWake:
    """``set``/``clear``/``wait(timeout)`` for greenlets of one gevent hub.

    ``set`` may be called from any greenlet or OS thread; the waiters are woken by a callback on
    their hub's loop (the thread-safe variant when called from another OS thread). Timeouts are
    kept by the hub's :class:`_Deadlines`, to within its resolution (5 ms). The hub is the one of
    the first ``wait``; a wait from another OS thread later (a subscription handed to a native
    thread) falls back to ``gevent.sleep`` polling of the flag, which is slow but correct.

    Nothing is allocated per wait in the common case: with thousands of subscriptions waiting in
    turn, per-wait objects (a waiter, a timer, its bound callback) each live just long enough to be
    promoted by the cyclic GC, whose collections then stall every greenlet for tens of milliseconds.
    """

    __slots__ = ("_deadlines", "_flag", "_hub", "_spare", "_thread", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        self._hub: Any = None
        self._deadlines: _Deadlines | None = None
        self._thread = 0
        self._waiters: list[Any] = []
        self._spare: Any = None  # one Waiter, reused across waits

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        self._flag = False

    def set(self) -> None:
        self._flag = True
        self._wake_all(True)

    def _wake_all(self, value: bool) -> None:
        waiters = self._waiters
        if not waiters:
            return
        loop = self._hub.loop
        schedule = loop.run_callback if _gevent().thread_id() == self._thread else loop.run_callback_threadsafe
        while waiters:  # pop one by one (atomic), so a waiter added meanwhile is either woken or sees the flag
            try:
                waiter = waiters.pop()
            except IndexError:
                break
            schedule(waiter.switch, value)

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        parts = _gevent()
        if self._hub is None:
            self._hub, self._thread = parts.get_hub(), parts.thread_id()
            self._deadlines = _Deadlines.of(self._hub)
        elif parts.thread_id() != self._thread:
            return self._wait_elsewhere(timeout)
        waiter, self._spare = self._spare, None
        if waiter is None:
            waiter = parts.Waiter(self._hub)
        else:
            # A switch that arrived after its wait ended (a deadline and set() firing together) is
            # dropped here; one arriving during the next wait only makes that wait return early.
            waiter.clear()
        deadlines = self._deadlines
        assert deadlines is not None
        tick = None if timeout is None else deadlines.add(self, timeout)
        self._waiters.append(waiter)
        try:
            if not self._flag:  # set() from another OS thread may have run since the first check
                waiter.get()
        finally:
            if tick is not None:
                deadlines.discard(self, tick)
            waiters = self._waiters
            if waiters:  # usually empty: set() took the waiter to wake it
                with contextlib.suppress(ValueError):
                    waiters.remove(waiter)
            self._spare = waiter
        return self._flag

    def _wait_elsewhere(self, timeout: float | None) -> bool:
        import time

        import gevent

        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._flag:
            if deadline is not None and time.monotonic() >= deadline:
                break
            gevent.sleep(0.005)
        return self._flag


class _Deadlines:
    """The timeouts of every :class:`HubWake` of one hub, kept by one timer armed for the earliest.

    Waits are filed under the tick (of ``RESOLUTION`` seconds) their deadline falls in, so that
    deadlines close together share one wake-up of the hub. One one-shot timer is armed for the
    earliest tick that still has waits; when it fires it wakes the waits of every tick that has
    passed and re-arms for the next. A tick whose waits all ended early (woken by ``set``) is left
    in the heap and skipped when the timer gets there: re-arming on every early end would cost a
    timer per wake-up on the delivery path. An idle hub is not woken at all: with no deadline
    pending there is no timer. Filing and unfiling a wait allocates nothing once its tick's set
    exists, unless its deadline is the earliest (then a new timer is armed for it).
    """

    RESOLUTION = 0.005
    _by_hub: weakref.WeakKeyDictionary[Any, _Deadlines] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, hub: Any) -> _Deadlines:
        deadlines = cls._by_hub.get(hub)
        if deadlines is None:
            deadlines = cls._by_hub[hub] = cls(hub)
        return deadlines

    def __init__(self, hub: Any) -> None:
        import heapq
        import time

        self._loop = hub.loop
        self._clock = time.monotonic
        self._push, self._pop = heapq.heappush, heapq.heappop
        self._slots: dict[int, set[HubWake]] = {}
        self._ticks: list[int] = []  # a heap of the keys of _slots (and of ticks emptied since)
        self._timer: Any = None
        self._armed = 0  # the tick the timer is armed for

    def add(self, wake: HubWake, timeout: float) -> int:
        tick = int((self._clock() + max(timeout, 0.0)) / self.RESOLUTION) + 1
        slot = self._slots.get(tick)
        if slot is None:
            slot = self._slots[tick] = set()
            self._push(self._ticks, tick)
        slot.add(wake)
        if self._timer is None or tick < self._armed:
            self._arm(tick)
        return tick

    def discard(self, wake: HubWake, tick: int) -> None:
        slot = self._slots.get(tick)
        if slot is not None:
            slot.discard(wake)
            if not slot:
                del self._slots[tick]  # its entry in the heap goes when the timer gets there
                if not self._slots and self._timer is not None:
                    # Nothing waits with a deadline: no timer (an idle hub must be able to exit).
                    self._timer.close()
                    self._timer = None
                    self._ticks.clear()

    def _arm(self, tick: int) -> None:
        if self._timer is not None:
            self._timer.close()
        # The loop's cached time may lag the clock; a timer that fires before its tick re-arms.
        self._timer = self._loop.timer(max(tick * self.RESOLUTION - self._clock(), 0.0))
        self._timer.start(self._fire)
        self._armed = tick

    def _fire(self) -> None:
        self._timer.close()
        self._timer = None
        now = int(self._clock() / self.RESOLUTION)
        ticks, slots = self._ticks, self._slots
        while ticks and ticks[0] <= now:
            slot = slots.pop(self._pop(ticks), None)
            if slot:
                for wake in slot:
                    wake._wake_all(False)
        while ticks and ticks[0] not in slots:
            self._pop(ticks)
        if ticks:
            self._arm(ticks[0])


class _GeventParts:
    """gevent's pieces that :class:`HubWake` uses, imported once (only when gevent is active)."""

    def __init__(self) -> None:
        from gevent._waiter import Waiter
        from gevent.hub import get_hub
        from gevent.monkey import get_original

        self.Waiter: Any = Waiter
        self.get_hub: Callable[[], Any] = get_hub
        # The OS thread, not the greenlet: patched threading.get_ident names greenlets.
        self.thread_id: Callable[[], int] = get_original("_thread", "get_ident")


_parts: _GeventParts | None = None


def _gevent() -> _GeventParts:
    global _parts
    if _parts is None:
        _parts = _GeventParts()
    return _parts
