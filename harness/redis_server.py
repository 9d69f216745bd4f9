"""Private Redis servers for tests that stop, kill or restart them.

Each server is a real ``redis-server`` child process on a free loopback port, with its data in a
temporary directory. It dies with the test process (``PR_SET_PDEATHSIG``) even if the test run is
killed. :class:`RedisClusterProcess` starts three such servers with ``--cluster-enabled yes`` and
joins them with ``redis-cli --cluster create``.

The shared server at 127.0.0.1:6379 is never started, stopped or reconfigured here.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

from harness.processes import die_with_parent, end_server

__all__ = ["RedisClusterProcess", "RedisServer", "free_port", "redis_available"]

REDIS_SERVER = shutil.which("redis-server") or "redis-server"
REDIS_CLI = shutil.which("redis-cli") or "redis-cli"


def redis_available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(*, bus: bool = False) -> int:
    """A free loopback port; with ``bus``, one whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if not bus:
            return port
        if port + 10000 < 65536 and _port_free(port + 10000):
            return port
    raise RuntimeError("no free port pair found")


def _ping(port: int, timeout: float = 0.2) -> bytes | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(64)
    except OSError:
        return None


class RedisServer:
    """One private ``redis-server``; ``appendonly`` turns on AOF with an fsync per write."""

    def __init__(
        self,
        *,
        appendonly: bool = False,
        port: int | None = None,
        directory: pathlib.Path | None = None,
        extra: Sequence[str] = (),
        cluster: bool = False,
    ) -> None:
        self.port = port or free_port(bus=cluster)
        self._own_dir = directory is None
        self.directory = directory or pathlib.Path(tempfile.mkdtemp(prefix=f"redis-{self.port}-"))
        self.appendonly = appendonly
        self.cluster = cluster
        self.extra = list(extra)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _args(self) -> list[str]:
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            "--appendonly", "yes" if self.appendonly else "no",
        ]  # fmt: skip
        if self.appendonly:
            args += ["--appendfsync", "always"]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
        return args + self.extra

    def start(self, timeout: float = 10.0) -> RedisServer:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.process = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent
        )
        deadline = time.monotonic() + timeout
        while True:
            reply = _ping(self.port)
            # A server with requirepass answers an unauthenticated PING with NOAUTH: it is up too.
            if reply is not None and reply.startswith((b"+PONG", b"-NOAUTH")):
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING: {self.log_tail()}")
            time.sleep(0.02)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / "redis.log").read_text()[-2000:]
        return ""

    def _wait_gone(self, timeout: float) -> None:
        assert self.process is not None
        end_server(self.process, lambda: _ping(self.port) is not None, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, sockets reset by the kernel."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self._wait_gone(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self._wait_gone(10)

    def restart(self, *, kill: bool = True) -> None:
        """Kill (or stop) and start again on the same port and directory."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.start()

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            [REDIS_CLI, "-p", str(self.port), *args], capture_output=True, timeout=30, check=True, text=True
        )
        return result.stdout

    def close(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisClusterProcess:
    """A three-master Redis Cluster of private servers on free loopback ports."""

    def __init__(self, masters: int = 3) -> None:
        self.servers = [RedisServer(cluster=True) for _ in range(masters)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(server.address for server in self.servers)

    def start(self, timeout: float = 60.0) -> RedisClusterProcess:
        try:
            for server in self.servers:
                server.start()
            subprocess.run(
                [REDIS_CLI, "--cluster", "create", *(s.address for s in self.servers), "--cluster-yes"],
                capture_output=True,
                timeout=timeout,
                check=True,
            )
            deadline = time.monotonic() + timeout
            while not all(self._ready(server) for server in self.servers):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis cluster did not become ready")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise
        return self

    @staticmethod
    def _ready(server: RedisServer) -> bool:
        try:
            info = server.cli("cluster", "info")
            slots = server.cli("cluster", "slots")
        except subprocess.SubprocessError:
            return False
        return "cluster_state:ok" in info and slots.count("127.0.0.1") >= 3

    def node_of_slot(self, slot: int) -> RedisServer:
        for server in self.servers:
            for line in server.cli("cluster", "nodes").splitlines():
                fields = line.split()
                if "myself" in fields[2]:
                    for spec in fields[8:]:
                        low, _, high = spec.partition("-")
                        if low.isdigit() and int(low) <= slot <= int(high or low):
                            return server
        raise LookupError(f"no node serves slot {slot}")

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> RedisClusterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def private_server(**kwargs: object) -> Iterator[RedisServer]:
    server = RedisServer(**kwargs)  # type: ignore[arg-type]
    try:
        yield server.start()
    finally:
        server.close()


def running_under_gevent() -> bool:
    return os.environ.get("GEVENT_SUPPORT") == "1" or "gevent.monkey" in __import__("sys").modules
