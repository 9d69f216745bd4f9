"""Settings of the SQLite adapter, parsed once from the URL and the connection options."""

from __future__ import annotations

import dataclasses
import sqlite3
import urllib.parse
from typing import Final

from ..._options import Options

__all__ = ["FEED_MAX_BACKOFF", "REREAD_INTERVAL", "SYNCHRONOUS_MODES", "SqliteSettings", "parse_path"]

#: How long a subscription waits before re-reading when no wake-up came: a last resort, as in the other
#: adapters. The change feed does not lose changes (it compares every watched topic's state whenever
#: ``PRAGMA data_version`` moves, and wakes every topic while it is failing), so this is not what
#: delivers; at 1 s, each of thousands of idle streams read its topic every second.
REREAD_INTERVAL: Final = 15.0
#: The longest back-off of a failing change feed (every subscription re-reads at each try).
FEED_MAX_BACKOFF: Final = 1.0
SYNCHRONOUS_MODES: Final = ("full", "normal")


def parse_path(url: str) -> str:
    """The database path of a ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` URL (not resolved)."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc:
        raise ValueError(f"sqlite URLs have no host: use sqlite:///relative.db or sqlite:////absolute.db, got {url!r}")
    # As in SQLAlchemy: the third slash ends the (empty) authority, a fourth starts an absolute path.
    path = urllib.parse.unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not path:
        raise ValueError(f"sqlite URL has no database path: {url!r}")
    if path == ":memory:" or path.startswith("file:"):
        raise ValueError("sqlite:// needs a database file; use memory:// for an in-process store")
    return path


@dataclasses.dataclass(frozen=True, slots=True)
class SqliteSettings:
    #: The database file (made absolute and resolved by ``open_driver`` before use).
    path: str
    #: Records kept per topic, applied in every append's transaction (``None``: unlimited).
    max_records: int | None = None
    #: Age after which ``admin.enforce_retention()`` drops records and idle topics (``None``: never).
    max_age_seconds: float | None = None
    #: ``PRAGMA synchronous``: ``FULL`` (fsync every commit) or ``NORMAL``.
    synchronous: str = "FULL"
    #: Seconds to wait for another writer's lock.
    busy_timeout: float = 30.0
    #: Seconds between the change feed's ``PRAGMA data_version`` checks.
    poll_interval: float = 0.05

    @classmethod
    def from_url(cls, url: str, options: Options) -> SqliteSettings:
        path = parse_path(url)
        max_records = options.pop_int("max_records", minimum=1)
        max_age_seconds = options.pop_float("max_age_seconds", minimum=0.001)
        synchronous = options.pop_str("synchronous", "full").strip().lower()
        if synchronous not in SYNCHRONOUS_MODES:
            modes = ", ".join(SYNCHRONOUS_MODES)
            raise ValueError(f"option 'synchronous' must be one of {modes}, got {synchronous!r}")
        return cls(
            path=path,
            max_records=max_records,
            max_age_seconds=max_age_seconds,
            synchronous=synchronous.upper(),
            busy_timeout=options.pop_float("busy_timeout", 30.0, minimum=0.0),
            poll_interval=options.pop_float("poll_interval", 0.05, minimum=0.001),
        )

    def connect(self) -> sqlite3.Connection:
        """Open and configure one connection. Blocking: call through ``run_blocking``."""
        connection = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE for writes
            check_same_thread=False,  # under gevent successive calls run on different pool threads
            cached_statements=64,
        )
        try:
            connection.execute(f"PRAGMA synchronous = {self.synchronous}")
        except BaseException:
            connection.close()
            raise
        return connection
