"""One asyncio event loop per backend object, on a native OS thread, and the hand-over to it.

nats-py is asyncio-only. Every call of the driver (from a plain thread, or a greenlet under gevent
monkey-patching) hands a coroutine to the loop with ``call_soon_threadsafe`` and waits for its
result on a :mod:`~api.core.durable_stream._cooperative` wake-up, which under gevent parks only the
calling greenlet (the loop thread sets it with the hub's thread-safe callback).

Under gevent the loop thread is started with the unpatched ``_thread`` primitives, its selector is
the original ``epoll``, and its connections are made with the original socket class (asyncio would
take gevent's, whose every instance gives the thread it is made in a hub of its own): the loop must
never run inside, or next to, a gevent hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..._contract import DurableStreamUnavailableError
from ..._cooperative import gevent_active, new_wake

__all__ = ["LoopThread", "raw_lock"]

T = TypeVar("T")


def _originals() -> tuple[Callable[..., Any], Callable[[], Any], type[selectors.BaseSelector]]:
    """``start_new_thread``, ``allocate_lock`` and a selector class that gevent has not patched."""
    import _thread

    if gevent_active() or "gevent.monkey" in sys.modules:
        from gevent.monkey import get_original

        start, allocate = get_original("_thread", ["start_new_thread", "allocate_lock"])
        selector: type[selectors.BaseSelector] = get_original("selectors", "DefaultSelector")
        return start, allocate, selector
    return _thread.start_new_thread, _thread.allocate_lock, selectors.DefaultSelector


def raw_lock() -> Any:
    """A lock that is never gevent's: shared by the loop thread and the callers' world."""
    return _originals()[1]()


class _NativeSocketLoop(asyncio.SelectorEventLoop):
    """A selector loop whose outgoing connections use the original socket class and resolver."""

    def __init__(self, selector: selectors.BaseSelector) -> None:
        super().__init__(selector)
        from gevent.monkey import get_original

        self._socket_class: type[socket.socket] = get_original("socket", "socket")
        self._resolve: Callable[..., list[Any]] = get_original("socket", "getaddrinfo")

    async def create_connection(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        if kwargs.get("sock") is not None or host is None:
            return await super().create_connection(protocol_factory, **kwargs)  # a socket given: no host
        for name in ("family", "proto", "flags", "local_addr", "happy_eyeballs_delay", "interleave"):
            kwargs.pop(name, None)
        if kwargs.get("ssl") and kwargs.get("server_hostname") is None:
            kwargs["server_hostname"] = host
        error: OSError | None = None
        # Resolved in this thread (a literal address needs no lookup; a name blocks only this loop).
        for family, kind, proto, _, address in self._resolve(host, port, type=socket.SOCK_STREAM):
            sock = self._socket_class(family, kind, proto)
            sock.setblocking(False)
            try:
                await self.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            return await super().create_connection(protocol_factory, sock=sock, **kwargs)
        raise error or OSError(f"cannot resolve {host!r}")


class _Outcome:
    __slots__ = ("error", "value")

    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None


class LoopThread:
    """An asyncio loop on its own native thread; :meth:`run` executes a coroutine there and waits."""

    def __init__(self, name: str) -> None:
        start, allocate, selector_cls = _originals()
        native = gevent_active() or "gevent.monkey" in sys.modules
        self.loop = _NativeSocketLoop(selector_cls()) if native else asyncio.SelectorEventLoop(selector_cls())
        self._stopped = allocate()
        self._stopped.acquire()
        self._closed = False
        self.name = name
        start(self._run, ())

    def _run(self) -> None:
        loop = self.loop
        try:
            asyncio.set_event_loop(loop)
            loop.run_forever()
            # Cancel what is left (a reconnect loop, readers) and let it finish.
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            with contextlib.suppress(Exception):
                loop.close()
            self._stopped.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, factory: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Start ``factory()`` on the loop without waiting for it (from any thread)."""
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self._spawn, factory)

    def _spawn(self, factory: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.loop.create_task(factory())

    def run(self, factory: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        """Run ``factory()`` on the loop and return its result (or raise its error) in the caller's world.

        Raises:
            DurableStreamUnavailableError: The loop is stopped, or no result came within ``timeout``
                (the coroutine is then cancelled).
        """
        if self._closed:
            raise DurableStreamUnavailableError("the NATS backend is closed")
        wake = new_wake()
        outcome = _Outcome()
        done = [False]
        task_box: list[asyncio.Task[T]] = []

        def finished(task: asyncio.Task[T]) -> None:
            if task.cancelled():
                outcome.error = DurableStreamUnavailableError("the NATS operation was cancelled")
            else:
                error = task.exception()
                if error is None:
                    outcome.value = task.result()
                else:
                    outcome.error = error
            done[0] = True
            wake.set()

        def start() -> None:
            task = self.loop.create_task(factory())
            task_box.append(task)
            task.add_done_callback(finished)

        try:
            self.loop.call_soon_threadsafe(start)
        except RuntimeError as exc:  # the loop is closed
            raise DurableStreamUnavailableError("the NATS backend is closed") from exc
        deadline = time.monotonic() + timeout
        while not done[0]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.submit_cancel(task_box)
                grace = time.monotonic() + 1.0
                while not done[0] and time.monotonic() < grace:
                    wake.wait(0.05)
                if not done[0]:
                    raise DurableStreamUnavailableError(f"no answer from NATS within {timeout:g} s")
                break
            wake.wait(remaining)
        if outcome.error is not None:
            error, outcome.error = outcome.error, None
            raise error
        return outcome.value  # type: ignore[no-any-return]

    def submit_cancel(self, task_box: list[asyncio.Task[Any]]) -> None:
        def cancel() -> None:
            for task in task_box:
                task.cancel()

        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(cancel)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop (cancelling what runs on it) and wait for its thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._stopped.acquire(True, timeout):
            self._stopped.release()
