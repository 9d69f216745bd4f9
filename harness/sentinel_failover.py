"""A Redis failover that Redis Sentinel carries out: a primary, a replica behind a freezable replication
link, and three sentinels that promote the replica when the primary dies.

The same interface as :class:`harness.failover.RedisFailover` (``url``, ``wait_replicated``,
``freeze_replication``, ``replica_behind``, ``fail_over``), so the failover suite's checks run on it
unchanged; what differs is who promotes and how clients find the new primary. Here nobody but the
sentinels acts: :meth:`fail_over` SIGKILLs the primary and waits until the sentinels have made the
replica the primary, and clients follow through a ``redis+sentinel://`` URL, asking the sentinels for
the primary on every new connection, as a Dify deployment with ``REDIS_USE_SENTINEL`` does.

The replica replicates through a :class:`~harness.switchable_relay.SwitchableRelay`: frozen, it receives
nothing more while the primary goes on acknowledging writes, so the replica the sentinels promote lacks
the last appends. Its replication timeout is long, so a frozen link still counts as up (a replica whose
link were down would not be promoted).
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
import time
import types
from typing import Self

from harness.redis_sentinel import SentinelProcess
from harness.redis_server import RedisServer
from harness.switchable_relay import SwitchableRelay

__all__ = ["RedisSentinelFailover"]

SERVICE = "failover"
#: How long the sentinels wait before they call an unanswering primary down (milliseconds).
DOWN_AFTER_MS = 1000
#: The sentinels' failover timeout (milliseconds); see :meth:`RedisSentinelFailover.start`.
FAILOVER_TIMEOUT_MS = 600_000


class RedisSentinelFailover:
    """A primary, its replica through a freezable link, and three sentinels watching them."""

    def __init__(self) -> None:
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="redis-sentinel-failover-"))
        self.primary = RedisServer(extra=["--repl-diskless-sync-delay", "0"])
        self.replica: RedisServer | None = None
        self.link: SwitchableRelay | None = None
        self.sentinels: list[SentinelProcess] = []

    @property
    def url(self) -> str:
        nodes = ",".join(sentinel.address for sentinel in self.sentinels)
        return f"redis+sentinel://{nodes}/{SERVICE}/0"

    def start(self) -> Self:
        try:
            self.primary.start()
            self.link = SwitchableRelay(("127.0.0.1", self.primary.port))
            self.replica = RedisServer(
                extra=["--replicaof", "127.0.0.1", str(self.link.port), "--repl-timeout", "600"]
            ).start()
            monitor = [
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2",
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
                # Also how long a sentinel leaves a replica replicating from another address than the
                # primary's before it points it at the primary (+fix-slave-config, after twice this):
                # that would take the replica off the freezable link in the middle of a slow test.
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {SERVICE} 1",
            ]
            self.sentinels = [SentinelProcess(self.directory, monitor, None) for _ in range(3)]
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait(self._settled, 30, "the sentinels to agree on the primary, its replica and each other")
            self.wait_replicated()
        except BaseException:
            self.close()
            raise
        return self

    def _settled(self) -> bool:
        assert self.replica is not None
        for sentinel in self.sentinels:
            if sentinel.cli("sentinel", "get-master-addr-by-name", SERVICE).split() != [
                "127.0.0.1",
                str(self.primary.port),
            ]:
                return False
            if str(self.replica.port) not in sentinel.cli("sentinel", "replicas", SERVICE):
                return False
            if sentinel.cli("sentinel", "sentinels", SERVICE).count("\nip\n") < 2:
                return False
        return True

    def _offsets(self) -> tuple[int, int, bool]:
        assert self.replica is not None
        primary = _fields(self.primary.cli("info", "replication"))
        replica = _fields(self.replica.cli("info", "replication"))
        return (
            int(primary["master_repl_offset"]),
            int(replica.get("slave_repl_offset", "-1")),
            replica.get("master_link_status") == "up",
        )

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Until the replica has applied everything the primary has written so far."""

        def level() -> bool:
            primary, replica, up = self._offsets()
            return up and replica >= primary

        self._wait(level, timeout, "the Redis replica to catch up")

    def freeze_replication(self) -> None:
        assert self.link is not None
        self.link.freeze()

    def replica_behind(self) -> bool:
        primary, replica, _ = self._offsets()
        return replica < primary

    def fail_over(self, timeout: float = 60.0) -> None:
        """SIGKILL the primary and wait until the sentinels have promoted the replica (whatever it had)."""
        assert self.replica is not None and self.link is not None
        replica = self.replica
        self.primary.kill()
        self.link.cut_all()  # what the primary sent and the relay held is dropped, never delivered

        def promoted() -> bool:
            named = [
                sentinel.cli("sentinel", "get-master-addr-by-name", SERVICE).split() for sentinel in self.sentinels
            ]
            return all(found == ["127.0.0.1", str(replica.port)] for found in named) and "role:master" in replica.cli(
                "info", "replication"
            )

        self._wait(promoted, timeout, "the sentinels to promote the replica")

    @staticmethod
    def _wait(check: object, timeout: float, what: str) -> None:
        assert callable(check)
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.05)

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        if self.link is not None:
            self.link.close()
        if self.replica is not None:
            self.replica.close()
        self.primary.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()


def _fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(":")
        if value:
            fields[name] = value
    return fields
