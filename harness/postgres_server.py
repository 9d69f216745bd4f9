"""A private PostgreSQL server for tests that stop, kill or restart it.

The shared server at 127.0.0.1:5432 must never be disturbed, so fault tests start their own:
``initdb`` into a temporary directory (once per test session; later servers copy that cluster),
then ``pg_ctl start`` on a free loopback port. Tests run as root and PostgreSQL refuses to, so the
server runs as the ``postgres`` OS user through ``runuser``.

    with PostgresServer() as server:
        backend = connect(server.url)
        server.stop()      # fast shutdown: clients see their connections closed
        server.start()     # same data directory and port
        server.kill()      # SIGKILL to the postmaster and every backend
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import types
from typing import Self

__all__ = ["PG_BIN", "PostgresServer", "as_postgres", "free_port", "owned_tempdir", "postgres_available"]

PG_BIN = pathlib.Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
_OS_USER = "postgres"
_template_lock = threading.Lock()
_template_dir: pathlib.Path | None = None


def postgres_available() -> bool:
    try:
        pwd.getpwnam(_OS_USER)
    except KeyError:
        return False
    return (PG_BIN / "initdb").exists() and (PG_BIN / "pg_ctl").exists() and shutil.which("runuser") is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(*command: str | os.PathLike[str], timeout: float = 60, check: bool = True) -> str:
    result = subprocess.run(
        ["runuser", "-u", _OS_USER, "--", *map(str, command)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({result.returncode}): {result.stdout}\n{result.stderr}")
    return result.stdout


def _owned_tempdir(prefix: str) -> pathlib.Path:
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    entry = pwd.getpwnam(_OS_USER)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o700)
    return path


def _template() -> pathlib.Path:
    """An initialised cluster, made once per process and copied for every server."""
    global _template_dir
    with _template_lock:
        if _template_dir is None:
            root = _owned_tempdir("ds-pg-template-")
            data = root / "data"
            atexit.register(shutil.rmtree, root, True)
            _as_postgres(PG_BIN / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            _template_dir = data
        return _template_dir


class PostgresServer:
    """One private server: a copied cluster, a free port, a unix socket directory of its own."""

    def __init__(self, *, database: str = "test") -> None:
        if not postgres_available():
            raise RuntimeError(f"PostgreSQL binaries not found under {PG_BIN}")
        self.port = _free_port()
        self.database = database
        self._root = _owned_tempdir("ds-pg-")
        self._data = self._root / "data"
        self._log = self._root / "server.log"
        template = _template()
        _as_postgres("cp", "-a", template, self._data)
        self._created_database = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.destroy()

    def start(self, timeout: float = 30) -> None:
        # fsync=off keeps it fast and survives a killed server (the OS still holds what was written);
        # synchronous_commit stays on, or a commit acknowledged just before kill() could be lost.
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self._root} "
            "-c fsync=off -c full_page_writes=off -c max_connections=60"
        )
        _as_postgres(
            PG_BIN / "pg_ctl", "-D", self._data, "-l", self._log, "-o", options, "-w", "-t", str(int(timeout)), "start"
        )
        if not self._created_database:
            self.psql(f"CREATE DATABASE {self.database}", database="postgres")
            self._created_database = True

    def stop(self, mode: str = "fast") -> None:
        """Shut down (``fast`` terminates sessions; ``immediate`` is a crash-like stop)."""
        _as_postgres(PG_BIN / "pg_ctl", "-D", self._data, "-m", mode, "-w", "stop", check=False)

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend, by process id."""
        import psutil

        pid = self.postmaster_pid()
        if pid is None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            postmaster = psutil.Process(pid)
            children = postmaster.children(recursive=True)
            for process in [postmaster, *children]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signal.SIGKILL)
            psutil.wait_procs([postmaster, *children], timeout=10)
        with contextlib.suppress(FileNotFoundError):
            (self._data / "postmaster.pid").unlink()

    def postmaster_pid(self) -> int | None:
        try:
            return int((self._data / "postmaster.pid").read_text().splitlines()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def is_running(self) -> bool:
        result = subprocess.run(
            [str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"],
            capture_output=True,
            check=False,
        )
        return result.returncode == 0

    def psql(self, sql: str, *, database: str | None = None) -> str:
        """Run one SQL command as the superuser and return psql's unaligned output."""
        result = subprocess.run(
            [
                str(PG_BIN / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database or self.database,
                "-AtX",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr}")
        return result.stdout

    def wait_until_down(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.is_running():
            if time.monotonic() > deadline:
                raise TimeoutError("the server is still accepting connections")
            time.sleep(0.05)

    def destroy(self) -> None:
        if self.postmaster_pid() is not None:
            self.stop(mode="immediate")
            if self.postmaster_pid() is not None:
                self.kill()
        shutil.rmtree(self._root, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def as_postgres(*command: str | os.PathLike[str], timeout: float = 60, check: bool = True) -> str:
    """Run a PostgreSQL program as the ``postgres`` OS user (the servers refuse to run as root)."""
    return _as_postgres(*command, timeout=timeout, check=check)


def owned_tempdir(prefix: str) -> pathlib.Path:
    """A new temporary directory owned by the ``postgres`` OS user (for a data directory)."""
    return _owned_tempdir(prefix)


def free_port() -> int:
    return _free_port()
