"""Primary and replica on loopback, with a replication link that can be frozen and an address that moves.

:class:`RedisFailover` and :class:`PostgresFailover` start a private primary and an asynchronous
replica of it whose replication connection runs through a :class:`~harness.switchable_relay.SwitchableRelay`
(frozen: the replica receives nothing more, while the primary goes on acknowledging writes), and a
second relay that is the address clients use. :meth:`fail_over` does what an operator or failover
tooling does when the primary dies: SIGKILL the primary, promote the replica (whatever it had
received), point the clients' address at it. No Sentinel here: ``REPLICAOF NO ONE`` and
``pg_ctl promote`` are the promotion.

    with RedisFailover() as pair:
        backend = connect(pair.url)
        ...append...; pair.wait_replicated()
        pair.freeze_replication()
        ...append k more: acknowledged by the primary only...
        pair.fail_over()
        ...the run goes on, on the promoted replica...
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import types
from collections.abc import Callable
from typing import Self

from harness.postgres_server import PG_BIN, PostgresServer, as_postgres, free_port, owned_tempdir
from harness.redis_server import RedisServer
from harness.switchable_relay import SwitchableRelay

__all__ = ["PostgresFailover", "RedisFailover"]


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


class RedisFailover:
    """A private Redis primary, its replica (through a freezable link) and the clients' movable address."""

    def __init__(self, *, extra: tuple[str, ...] = ()) -> None:
        # No 5 s wait for more replicas before a full sync starts (the default diskless-sync delay).
        self.primary = RedisServer(extra=[*extra, "--repl-diskless-sync-delay", "0"])
        self.replica: RedisServer | None = None
        self.link: SwitchableRelay | None = None
        self.address: SwitchableRelay | None = None
        self._extra = extra

    @property
    def url(self) -> str:
        assert self.address is not None
        return f"redis://127.0.0.1:{self.address.port}/0"

    def start(self) -> Self:
        try:
            self.primary.start()
            self.link = SwitchableRelay(("127.0.0.1", self.primary.port))
            self.replica = RedisServer(
                extra=[*self._extra, "--replicaof", "127.0.0.1", str(self.link.port), "--repl-timeout", "600"]
            ).start()
            self.address = SwitchableRelay(("127.0.0.1", self.primary.port))
            self.wait_replicated()
        except BaseException:
            self.close()
            raise
        return self

    def _offsets(self) -> tuple[int, int, bool]:
        assert self.replica is not None
        primary = _info_fields(self.primary.cli("info", "replication"))
        replica = _info_fields(self.replica.cli("info", "replication"))
        up = replica.get("master_link_status") == "up"
        return int(primary["master_repl_offset"]), int(replica.get("slave_repl_offset", "-1")), up

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Until the replica has applied everything the primary has written so far."""

        def level() -> bool:
            primary, replica, up = self._offsets()
            return up and replica >= primary

        _wait(level, timeout, "the Redis replica to catch up")

    def freeze_replication(self) -> None:
        assert self.link is not None
        self.link.freeze()

    def replica_behind(self) -> bool:
        primary, replica, _ = self._offsets()
        return replica < primary

    def fail_over(self) -> None:
        """SIGKILL the primary, promote the replica with what it has, move the clients' address to it."""
        assert self.replica is not None and self.link is not None and self.address is not None
        self.primary.kill()
        self.link.cut_all()  # what the primary sent and the relay held is dropped, never delivered
        replica = self.replica
        replica.cli("replicaof", "no", "one")
        _wait(lambda: "role:master" in replica.cli("info", "replication"), 10, "the replica's promotion")
        self.address.switch(("127.0.0.1", replica.port))

    def close(self) -> None:
        for relay in (self.address, self.link):
            if relay is not None:
                relay.close()
        if self.replica is not None:
            self.replica.close()
        self.primary.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()


def _info_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        name, colon, value = line.strip().partition(":")
        if colon:
            fields[name] = value
    return fields


class PostgresFailover:
    """A private PostgreSQL primary, an asynchronous streaming replica (``pg_basebackup``) whose WAL comes
    through a freezable link, and the clients' movable address."""

    def __init__(self) -> None:
        self.primary = PostgresServer()
        self.replica_root = owned_tempdir("ds-pg-replica-")
        self.replica_port = 0
        self.link: SwitchableRelay | None = None
        self.address: SwitchableRelay | None = None
        self._replica_started = False

    @property
    def url(self) -> str:
        assert self.address is not None
        return f"postgresql://postgres@127.0.0.1:{self.address.port}/{self.primary.database}"

    @property
    def _replica_data(self) -> str:
        return str(self.replica_root / "data")

    def start(self) -> Self:
        try:
            self.primary.start()
            self.link = SwitchableRelay(("127.0.0.1", self.primary.port))
            self.replica_port = free_port()
            # A base backup through the link, then streaming from it: -R writes primary_conninfo there.
            as_postgres(
                PG_BIN / "pg_basebackup",
                "-h", "127.0.0.1", "-p", str(self.link.port), "-U", "postgres",
                "-D", self._replica_data, "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
                timeout=120,
            )  # fmt: skip
            options = (
                f"-p {self.replica_port} -c listen_addresses=127.0.0.1 -k {self.replica_root} "
                "-c fsync=off -c full_page_writes=off -c max_connections=60 -c hot_standby=on"
            )
            as_postgres(
                PG_BIN / "pg_ctl", "-D", self._replica_data, "-l", self.replica_root / "server.log",
                "-o", options, "-w", "-t", "60", "start",
            )  # fmt: skip
            self._replica_started = True
            self.address = SwitchableRelay(("127.0.0.1", self.primary.port))
            self.wait_replicated()
        except BaseException:
            self.close()
            raise
        return self

    def _replica_sql(self, sql: str) -> str:
        result = subprocess.run(
            [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.replica_port), "-U", "postgres",
             "-d", self.primary.database, "-AtX", "-c", sql],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"psql on the replica failed: {result.stderr}")
        return result.stdout.strip()

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Until the replica has replayed everything the primary has written so far."""
        target = self.primary.psql("SELECT pg_current_wal_lsn()").strip()

        def level() -> bool:
            replayed = self._replica_sql("SELECT pg_last_wal_replay_lsn()")
            return bool(replayed) and self._replica_sql(f"SELECT '{replayed}'::pg_lsn >= '{target}'::pg_lsn") == "t"

        _wait(level, timeout, "the PostgreSQL replica to catch up")

    def freeze_replication(self) -> None:
        assert self.link is not None
        self.link.freeze()

    def replica_behind(self) -> bool:
        target = self.primary.psql("SELECT pg_current_wal_lsn()").strip()
        replayed = self._replica_sql("SELECT pg_last_wal_replay_lsn()")
        return self._replica_sql(f"SELECT '{replayed}'::pg_lsn < '{target}'::pg_lsn") == "t"

    def fail_over(self) -> None:
        """SIGKILL the primary, promote the replica with what it has, move the clients' address to it."""
        assert self.link is not None and self.address is not None
        self.primary.kill()
        self.link.cut_all()
        as_postgres(PG_BIN / "pg_ctl", "-D", self._replica_data, "-w", "-t", "60", "promote")
        _wait(lambda: self._replica_sql("SELECT pg_is_in_recovery()") == "f", 30, "the replica's promotion")
        self.address.switch(("127.0.0.1", self.replica_port))

    def close(self) -> None:
        for relay in (self.address, self.link):
            if relay is not None:
                relay.close()
        if self._replica_started:
            as_postgres(PG_BIN / "pg_ctl", "-D", self._replica_data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.replica_root, ignore_errors=True)
        with contextlib.suppress(Exception):
            self.primary.destroy()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()
