"""A private Redis Sentinel deployment for tests: a primary, a replica and three sentinels on loopback.

Every process is a real ``redis-server`` (the sentinels run it with ``--sentinel``) on a free loopback
port, with its files in a temporary directory, and dies with the test process. The sentinels watch
the primary under :attr:`RedisSentinelDeployment.service` with a quorum of two, so a test can kill
the primary (or ask for a failover) and see the replica promoted within a few seconds.

With ``password`` the primary and the replica require it (and the sentinels use it to reach them);
with ``sentinel_password`` the sentinels require one of their own, as Dify's
``REDIS_SENTINEL_PASSWORD`` expects. The shared server at 127.0.0.1:6379 is never touched.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import subprocess
import tempfile
import time

from harness.processes import die_with_parent, end_server
from harness.redis_server import REDIS_CLI, REDIS_SERVER, RedisServer, free_port

__all__ = ["RedisSentinelDeployment", "SentinelProcess"]

#: How long the sentinels wait before they call an unanswering primary down (milliseconds).
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class SentinelProcess:
    """One ``redis-server --sentinel`` with a configuration file of its own (sentinels rewrite it)."""

    def __init__(self, directory: pathlib.Path, lines: list[str], password: str | None) -> None:
        self.port = free_port()
        self.directory = directory
        self.password = password
        self.config = directory / f"sentinel-{self.port}.conf"
        body = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {directory}",
            f"logfile {directory / f'sentinel-{self.port}.log'}",
            *lines,
        ]
        if password:
            body.append(f"requirepass {password}")
        self.config.write_text("\n".join(body) + "\n")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [REDIS_SERVER, str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )

    def cli(self, *args: str) -> str:
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        result = subprocess.run(
            [REDIS_CLI, "-p", str(self.port), *auth, *args], capture_output=True, timeout=10, check=False, text=True
        )
        return result.stdout

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            end_server(self.process, lambda: False, 10)


class RedisSentinelDeployment:
    """A primary, a replica and three sentinels; ``with`` starts them and waits until all agree."""

    def __init__(
        self, *, service: str = "mymaster", password: str | None = None, sentinel_password: str | None = None
    ) -> None:
        self.service = service
        self.password = password
        self.sentinel_password = sentinel_password
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="redis-sentinel-"))
        auth = ["--requirepass", password, "--masterauth", password] if password else []
        self.primary = RedisServer(extra=auth)
        self.replica = RedisServer(extra=[*auth, "--replicaof", "127.0.0.1", str(self.primary.port)])
        monitor = [
            f"sentinel monitor {service} 127.0.0.1 {self.primary.port} 2",
            f"sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {service} 1",
        ]
        if password:
            monitor.append(f"sentinel auth-pass {service} {password}")
        self.sentinels = [SentinelProcess(self.directory, monitor, sentinel_password) for _ in range(3)]

    @property
    def sentinel_nodes(self) -> str:
        """Dify's ``REDIS_SENTINELS``: ``host:port,host:port,host:port``."""
        return ",".join(sentinel.address for sentinel in self.sentinels)

    def start(self, timeout: float = 30.0) -> RedisSentinelDeployment:
        try:
            self.primary.start()
            self.replica.start()
            for sentinel in self.sentinels:
                sentinel.start()
            deadline = time.monotonic() + timeout
            while not self._settled():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the sentinels did not settle: {self._log_tail()}")
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        return self

    def _settled(self) -> bool:
        """Every sentinel knows the primary, the replica (in sync) and the two other sentinels."""
        for sentinel in self.sentinels:
            master = sentinel.cli("sentinel", "get-master-addr-by-name", self.service).split()
            if master != ["127.0.0.1", str(self.primary.port)]:
                return False
            if "flags\ns_down" in sentinel.cli("sentinel", "master", self.service):
                return False
            replicas = sentinel.cli("sentinel", "replicas", self.service)
            if str(self.replica.port) not in replicas:
                return False
            if sentinel.cli("sentinel", "sentinels", self.service).count("\nip\n") < 2:
                return False
        return "master_link_status:up" in self._cli(self.replica, "info", "replication")

    def _cli(self, server: RedisServer, *args: str) -> str:
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        result = subprocess.run(
            [REDIS_CLI, "-p", str(server.port), *auth, *args], capture_output=True, timeout=10, check=False, text=True
        )
        return result.stdout

    def master_port(self) -> int:
        """The primary's port as the first sentinel that answers sees it now."""
        for sentinel in self.sentinels:
            found = sentinel.cli("sentinel", "get-master-addr-by-name", self.service).split()
            if len(found) == 2:
                return int(found[1])
        raise RuntimeError("no sentinel answered")

    def failover(self, timeout: float = 60.0, *, demoted: bool = False) -> int:
        """Promote the replica (``SENTINEL FAILOVER``); return the new primary's port once it accepts writes.

        With ``demoted``, also wait until the old primary has become a replica (its writes then
        answer ``READONLY``); the sentinels reconfigure it some seconds after the promotion.
        """
        before = self.master_port()
        self.sentinels[0].cli("sentinel", "failover", self.service)
        deadline = time.monotonic() + timeout
        while True:
            port = self.master_port()
            server, old = (self.primary, self.replica) if port == self.primary.port else (self.replica, self.primary)
            promoted = port != before and "role:master" in self._cli(server, "info", "replication")
            if promoted and (not demoted or "role:slave" in self._cli(old, "info", "replication")):
                return port
            if time.monotonic() > deadline:
                raise RuntimeError(f"no failover within {timeout} s: {self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self) -> str:
        tails = []
        for sentinel in self.sentinels:
            with contextlib.suppress(OSError):
                tails.append((self.directory / f"sentinel-{sentinel.port}.log").read_text()[-800:])
        return "\n".join(tails)

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        self.replica.close()
        self.primary.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisSentinelDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
