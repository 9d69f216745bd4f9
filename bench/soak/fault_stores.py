"""Private stream stores that a scenario kills and restarts, and kills at the moment runs end.

``kill()`` is SIGKILL (no shutdown, no final save; sockets reset by the kernel), ``start()`` brings
the same server back on the same port and data directory. Start and restart from the main thread:
a private ``redis-server`` dies with the thread that started it.

Killing "during the terminal append" needs to know when runs end. On Redis a ``MONITOR``
connection watches the commands the server runs, and the server is killed the moment one carries a
``workflow_finished`` payload: that append ran, the seal that follows it most likely did not. On
PostgreSQL a trigger on the library's ``topics`` table holds each seal (the ``UPDATE … SET sealed``
that follows a run's ``workflow_finished``) in ``pg_sleep`` while a flag row exists; the server is
killed once every run's seal is held, so every run's end is written and none is sealed. Both are
instruments on a private server, not changes to the library: its statements run unmodified.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from typing import Protocol

from harness.postgres_server import PostgresServer
from harness.redis_server import RedisServer

#: The schema the library uses on the private PostgreSQL server.
SCHEMA = "soak"
TERMINAL_MARK = b"workflow_finished"


class FaultStore(Protocol):
    name: str
    #: Whether what was stored before a kill is there after the restart.
    persistent: bool

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def kill(self) -> None: ...

    def arm_end_kill(self) -> None:
        """Prepare to kill the store at runs' ends (before the runs start)."""

    def kill_at_end(self, runs: int, timeout: float) -> int:
        """Block until the store was killed at runs' ends (``runs`` of them, where that can be waited for).

        Returns how many runs' terminal writes are known to have been in flight at the kill.
        """

    def close(self) -> None: ...


class RedisFaultStore:
    def __init__(self, *, appendonly: bool) -> None:
        self.name = "redis-aof" if appendonly else "redis"
        self.persistent = appendonly
        self.server = RedisServer(appendonly=appendonly)
        self._killed = threading.Event()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        return f"{self.server.url}?key_prefix=soak:"

    def start(self) -> None:
        self.server.start()

    def kill(self) -> None:
        self.server.kill()

    def arm_end_kill(self) -> None:
        self._killed.clear()
        self._stop.clear()
        monitor = socket.create_connection(("127.0.0.1", self.server.port))
        monitor.sendall(b"MONITOR\r\n")
        self._watcher = threading.Thread(target=self._watch, args=(monitor,), name="redis-end-watch", daemon=True)
        self._watcher.start()

    def _watch(self, monitor: socket.socket) -> None:
        # Raw bytes, no parsing: the kill must follow the append by as little as possible.
        tail = b""
        monitor.settimeout(0.2)
        with monitor:
            while not self._stop.is_set():
                try:
                    data = monitor.recv(1 << 16)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                if TERMINAL_MARK in tail + data:
                    process = self.server.process
                    if process is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(process.pid, signal.SIGKILL)
                    self._killed.set()
                    return
                tail = data[-len(TERMINAL_MARK) :]

    def kill_at_end(self, runs: int, timeout: float) -> int:
        if not self._killed.wait(timeout):
            self._stop.set()
            raise TimeoutError("no run appended workflow_finished")
        self.server.kill()  # reaps the process and waits until the port is free
        return 1  # the append that was seen; the other runs were somewhere near their ends

    def close(self) -> None:
        self._stop.set()
        self.server.close()


class PostgresFaultStore:
    name = "postgres"
    persistent = True

    def __init__(self) -> None:
        self.server = PostgresServer()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.server.port}/{self.server.database}?schema={SCHEMA}"

    def start(self) -> None:
        self.server.start()

    def kill(self) -> None:
        self.server.kill()

    def arm_end_kill(self) -> None:
        """The trigger that holds seals (the library must have created its tables: connect first)."""
        self.server.psql(
            f"""
            CREATE TABLE IF NOT EXISTS public.soak_hold (held boolean);
            CREATE OR REPLACE FUNCTION public.soak_hold_seal() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM public.soak_hold) THEN PERFORM pg_sleep(120); END IF;
                RETURN NEW;
            END $$;
            DROP TRIGGER IF EXISTS soak_hold_seal ON {SCHEMA}.topics;
            CREATE TRIGGER soak_hold_seal BEFORE UPDATE ON {SCHEMA}.topics FOR EACH ROW
                WHEN (NEW.sealed AND NOT OLD.sealed) EXECUTE FUNCTION public.soak_hold_seal();
            INSERT INTO public.soak_hold VALUES (true);
            """
        )

    def held(self) -> int:
        return int(self.server.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'").strip())

    def kill_at_end(self, runs: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.held() < runs:
            if time.monotonic() >= deadline:
                if self.held() == 0:
                    raise TimeoutError("no run's seal was held")
                break  # kill with the seals that are held
            time.sleep(0.05)
        # Seals after the restart must not be held: the flag goes first (the held ones sleep on).
        self.server.psql("DELETE FROM public.soak_hold")
        held = self.held()
        self.server.kill()
        return held

    def close(self) -> None:
        self.server.destroy()


def fault_store(name: str) -> FaultStore:
    if name == "redis":
        return RedisFaultStore(appendonly=False)
    if name == "redis-aof":
        return RedisFaultStore(appendonly=True)
    if name == "postgres":
        return PostgresFaultStore()
    raise ValueError(f"unknown fault store {name!r}")
