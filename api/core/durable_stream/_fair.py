"""FIFO-fair locks and semaphores, for plain threads and for gevent-patched threading alike.

Neither ``threading.Lock`` nor gevent's patched lock is fair. Under gevent, releasing a lock only
schedules its waiter; the releasing greenlet runs on, and if it loops back to ``acquire()`` before
yielding it takes the lock again. A greenlet that appends in a tight loop therefore keeps a writer
lock (or a pooled connection) to itself, and a ``seal()`` waiting for it never runs. OS threads can
barge the same way, only less often.

:class:`FairSemaphore` hands a released token straight to the longest-waiting caller, so that a
caller who releases and re-acquires queues behind everyone already waiting. Waiters block on a
lock of their own, which is gevent's cooperative lock when ``threading`` is patched: no busy-wait,
and the hub keeps running. Without contention neither ``acquire`` nor ``release`` takes a lock.
"""

from __future__ import annotations

import collections
import threading
import types
from typing import Self

__all__ = ["FairLock", "FairSemaphore"]


class FairSemaphore:
    """A counting semaphore that grants its tokens in the order the callers asked for them.

    A caller that gives up (a timeout, or an exception such as ``gevent.Timeout`` while it waits)
    leaves the queue; a token handed to it at that very moment is passed on to the next waiter.
    """

    __slots__ = ("_mutex", "_tokens", "_waiters")

    def __init__(self, value: int = 1) -> None:
        if value < 0:
            raise ValueError("a semaphore's initial value must not be negative")
        # Tokens and waiters are deques because their append and pop are atomic: the uncontended
        # paths read and change them without the mutex. Only queueing and hand-over take it.
        self._tokens: collections.deque[None] = collections.deque([None] * value)
        self._waiters: collections.deque[threading.Lock] = collections.deque()
        self._mutex = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take a token, waiting (at most ``timeout`` seconds) behind earlier callers; return whether one was taken."""
        if not self._waiters:
            # Nobody queued: taking a free token passes no one. A waiter that queues between the
            # check and the pop is passed at most once, by a caller who looked first.
            try:
                self._tokens.pop()
            except IndexError:
                pass
            else:
                return True
        return self._queue_up(blocking, timeout)

    def release(self) -> None:
        """Return a token; the longest waiter, if any, gets it before anyone who asks later."""
        self._tokens.append(None)
        # A waiter that queued after this check finds the token itself (see _queue_up).
        if self._waiters:
            with self._mutex:
                self._hand_over()

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.release()

    def _queue_up(self, blocking: bool, timeout: float | None) -> bool:
        with self._mutex:
            if not self._waiters:
                try:
                    self._tokens.pop()
                except IndexError:
                    pass
                else:
                    return True
            if not blocking:
                return False
            # Looked up at call time: under gevent this is the patched, cooperative lock.
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
            # A release() that put a token back before this waiter was visible did not hand it over.
            self._hand_over()
        try:
            if turn.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
                return True
        except BaseException:
            if not self._withdraw(turn):
                self.release()  # handed over as the wait was interrupted: pass it on
            raise
        return not self._withdraw(turn)  # a token that arrived with the timeout is still taken

    def _withdraw(self, turn: threading.Lock) -> bool:
        """Leave the queue; ``False`` if a token was handed to ``turn`` first."""
        with self._mutex:
            try:
                self._waiters.remove(turn)
            except ValueError:
                return False
            return True

    def _hand_over(self) -> None:
        """Give free tokens to the waiters in order. Called with the mutex held."""
        while self._waiters:
            try:
                self._tokens.pop()
            except IndexError:  # none free, or an uncontended acquire() took it meanwhile
                return
            self._waiters.popleft().release()


class FairLock(FairSemaphore):
    """A mutual-exclusion lock whose waiters are served first come, first served (not re-entrant)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(1)

    def locked(self) -> bool:
        return not self._tokens

    def release(self) -> None:
        if self._tokens:
            raise RuntimeError("release of an unlocked FairLock")
        super().release()
