"""Where the Redis adapter's commands go: standalone Redis or a cluster, through fair connection pools.

:class:`Standalone` talks to one server through two small pools of redis-py connections of its own
(:class:`FairConnectionPool`), bypassing redis-py's client layer on the hot path; :class:`Cluster` uses
redis-py's ``RedisCluster`` with a bounded, FIFO-fair pool per node (:class:`FairQueue`).
:class:`PackedAppend` encodes the append command once per topic. The driver sees either deployment
through the :class:`Deployment` protocol.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import queue
import select
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from ..._contract import DurableStreamUnavailableError
from ..._driver import Position
from ..._fair import FairSemaphore
from .scripts import APPEND_SCRIPT, READ_SCRIPT, Script
from .sentinel import sentinel_template
from .settings import SSL_OPTIONS, SentinelSettings

__all__ = [
    "POOL_WAIT",
    "Cluster",
    "Deployment",
    "FairConnectionPool",
    "FairQueue",
    "PackedAppend",
    "Standalone",
    "idle_socket_healthy",
]

#: How long a command waits for a free pooled connection: many readers sharing a few connections
#: queue here under load, which is slower but not a failure.
POOL_WAIT = 30.0


class Deployment(Protocol):
    """What the driver needs from standalone Redis or from a cluster."""

    def evalsha(self, script: Script, keys: Sequence[bytes], args: Sequence[Any], *, read: bool = False) -> Any: ...

    def read(self, keys: Sequence[bytes], after: Position, limit: int) -> Any:
        """The READ script's reply: ``{epoch, first, last, sealed, last id, last digest, entries}`` or empty."""
        ...

    def heads(self, keys: Sequence[tuple[bytes, bytes]]) -> list[tuple[Any, Any]]:
        """``(HMGET meta e l i s h, XLEN stream)`` for each ``(meta, stream)``, in one round trip per node."""
        ...

    def scan(self, pattern: bytes) -> Iterator[bytes]: ...

    def ping(self) -> None: ...

    def address_of(self, channel: bytes) -> str: ...

    def feed_connection(self, address: str, client_name: str) -> Any: ...

    def refresh_topology(self) -> None: ...

    def close(self) -> None: ...


class FairConnectionPool:
    """A small bounded, blocking pool of redis-py connections, checked for a closed socket on checkout.

    It replaces redis-py's client and pool layers on the hot path (they cost several times the
    round trip itself on a small machine) but keeps redis-py's connections and hiredis parser.
    A checkout takes one of ``size`` turns from a :class:`~api.core.durable_stream._fair.FairSemaphore`, then the most
    recently returned connection (or a new one). The turns are granted in arrival order, so a
    caller that returns its connection and at once asks again queues behind those already
    waiting, instead of taking the connection back before the waiter it woke runs. Without
    contention a checkout and a return are a few ``deque`` operations, and no lock.
    """

    def __init__(self, factory: Callable[[], Any], size: int, timeout: float) -> None:
        self._factory = factory
        self._turns = FairSemaphore(size)
        self._idle: collections.deque[Any] = collections.deque()
        self._created: list[Any] = []
        self._created_lock = threading.Lock()  # only taken to make a connection, and by close()
        self._timeout = max(timeout, POOL_WAIT)

    def acquire(self) -> Any:
        if not self._turns.acquire(timeout=self._timeout):
            raise DurableStreamUnavailableError("no Redis connection became free in time")
        try:
            connection = self._idle.pop()
        except IndexError:
            # Every connection made so far is out with another turn's holder: fewer than ``size``.
            try:
                with self._created_lock:
                    connection = self._factory()
                    self._created.append(connection)
            except BaseException:
                self._turns.release()
                raise
        if not idle_socket_healthy(connection):
            # The server closed it (restart, idle timeout): never send a command into a dead
            # socket, where an append could not tell "refused" from "maybe stored".
            connection.disconnect()
        return connection

    def release(self, connection: Any, healthy: bool) -> None:
        if not healthy:
            with contextlib.suppress(Exception):
                connection.disconnect()
        self._idle.append(connection)  # before the turn goes: its next holder finds a connection
        self._turns.release()

    def close(self) -> None:
        with self._created_lock:
            connections, self._created = self._created, []
        self._idle.clear()
        for connection in connections:
            with contextlib.suppress(Exception):
                connection.disconnect()


class FairQueue:
    """The queue of connections inside redis-py's ``BlockingConnectionPool`` (cluster mode), made fair.

    redis-py's default ``LifoQueue`` lets a caller that puts a connection back and at once asks
    again take it before the waiter it woke runs; under gevent that starves the waiter (a seal
    behind appenders) until the pool's timeout. Items wait in LIFO order (warm connections first,
    then redis-py's ``None`` placeholders); callers are served FIFO by a
    :class:`~api.core.durable_stream._fair.FairSemaphore` counting them. Only what
    ``BlockingConnectionPool`` uses is implemented.
    """

    def __init__(self, maxsize: int = 0) -> None:
        self.queue: collections.deque[Any] = collections.deque()
        self.maxsize = maxsize
        self._available = FairSemaphore(0)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not self._available.acquire(blocking=block, timeout=timeout):
            raise queue.Empty
        return self.queue.pop()

    def put_nowait(self, item: Any) -> None:
        if 0 < self.maxsize <= len(self.queue):
            raise queue.Full  # how the pool fills the queue with placeholders: until it is full
        self.queue.append(item)  # before the count goes up: whoever is counted in finds an item
        self._available.release()

    put = put_nowait

    def qsize(self) -> int:
        return len(self.queue)

    def empty(self) -> bool:
        return not self.queue

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self.queue)


def idle_socket_healthy(connection: Any) -> bool:
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return True  # not connected yet: it connects on first use
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable  # an idle connection has nothing to read unless the server hung up


class Standalone:
    """One server: a URL's (``redis://``, ``rediss://``), or the primary a sentinel names (``sentinel``)."""

    def __init__(
        self,
        url: str,
        common: dict[str, Any],
        read_size: int,
        write_size: int,
        name: str,
        *,
        sentinel: SentinelSettings | None = None,
    ) -> None:
        if sentinel is None:
            from redis import ConnectionPool as RedisPyPool

            # Only URL parsing (host, port, db, credentials, TLS) is taken from redis-py's pool.
            template = RedisPyPool.from_url(url, **common)
            self._connection_class: Any = template.connection_class
            self._kwargs = dict(template.connection_kwargs)
        else:
            # Every new connection asks the sentinels where the primary is (sentinel module).
            self._sentinel_pool = sentinel_template(sentinel, common)
            self._connection_class = self._sentinel_pool.connection_class
            self._kwargs = dict(self._sentinel_pool.connection_kwargs)
        timeout = float(common["socket_timeout"])
        self._reader = FairConnectionPool(lambda: self._connect(f"{name}:read"), read_size, timeout)
        self._writer = FairConnectionPool(lambda: self._connect(f"{name}:write"), write_size, timeout)

    def _connect(self, client_name: str) -> Any:
        return self._connection_class(**{**self._kwargs, "client_name": client_name})

    def _execute(self, pool: FairConnectionPool, *args: Any) -> Any:
        return self._roundtrip(pool, None, args)

    def _roundtrip(self, pool: FairConnectionPool, packed: bytes | None, args: Sequence[Any] = ()) -> Any:
        """Send one command (``packed`` already, or ``args`` to be packed) and read its reply."""
        from redis.exceptions import ResponseError

        connection = pool.acquire()
        healthy = False
        try:
            if packed is None:
                connection.send_command(*args)
            else:
                connection.send_packed_command((packed,), check_health=False)
            try:
                reply = connection.read_response()
            except ResponseError:
                healthy = True  # an error reply leaves the connection in step
                raise
            healthy = True
            return reply
        finally:
            pool.release(connection, healthy)

    def evalsha_packed(self, script: Script, command: bytes) -> Any:
        """Run an ``EVALSHA`` of ``script`` that :class:`PackedAppend` encoded, on a write connection."""
        return self._loading(script, self._writer, lambda: self._roundtrip(self._writer, command))

    def evalsha_waiting(
        self, script: Script, command: bytes | None, keys: Sequence[bytes], args: Sequence[Any], wait: tuple[int, int]
    ) -> tuple[Any, int]:
        """An ``EVALSHA`` (``command`` packed already, or ``keys`` and ``args``) followed by ``WAIT replicas
        timeout`` on the same connection (``WAIT`` counts that connection's writes): the script's reply
        and how many replicas acknowledged it."""
        from redis.exceptions import ResponseError

        def run() -> tuple[Any, int]:
            connection = self._writer.acquire()
            healthy = False
            try:
                script_command = command
                if script_command is None:
                    script_command = b"".join(connection.pack_command("EVALSHA", script.sha, len(keys), *keys, *args))
                waiting = b"".join(connection.pack_command("WAIT", *wait))
                connection.send_packed_command((script_command, waiting), check_health=False)
                try:
                    reply = connection.read_response()
                except ResponseError:
                    connection.read_response()  # the WAIT's reply: the connection stays in step
                    healthy = True
                    raise
                acknowledged = int(connection.read_response())
                healthy = True
                return reply, acknowledged
            finally:
                self._writer.release(connection, healthy)

        result: tuple[Any, int] = self._loading(script, self._writer, run)
        return result

    def evalsha(self, script: Script, keys: Sequence[bytes], args: Sequence[Any], *, read: bool = False) -> Any:
        pool = self._reader if read else self._writer
        return self._loading(script, pool, lambda: self._execute(pool, "EVALSHA", script.sha, len(keys), *keys, *args))

    def _loading(self, script: Script, pool: FairConnectionPool, run: Callable[[], Any]) -> Any:
        """``run()`` an ``EVALSHA`` of ``script``, loading the script first if the server forgot it."""
        from redis.exceptions import NoScriptError

        try:
            return run()
        except NoScriptError:  # not run at all (a restarted server forgot it): safe to load and repeat
            self._execute(pool, "SCRIPT", "LOAD", script.source)
            return run()

    def read(self, keys: Sequence[bytes], after: Position, limit: int) -> Any:
        # A MULTI/EXEC snapshot rather than the READ script: the same atomicity, without Lua
        # copying every entry into a table and back (several times the cost per record).
        meta, stream = keys[0], keys[1]
        start = b"(" + after.native.encode() if after.native else b"-"
        state, length, entries = self._transaction(
            self._reader,
            ("HMGET", meta, "e", "l", "i", "s", "h"),
            ("XLEN", stream),
            ("XRANGE", stream, start, "+", "COUNT", limit),
        )
        if state[0] is None:
            return []
        last = int(state[1] or 0)
        first = last - int(length) + 1
        target = after.ordinal + 1
        if not first <= target <= last:
            entries = []  # nothing new, or a gap: the head alone says which
        elif not after.native and target > first:
            # No stream ID to start from, and not at the first record: locate the ordinal server-side.
            return self.evalsha(READ_SCRIPT, keys, (after.ordinal, "", limit), read=True)
        elif after.native and (not entries or _ordinal_of(entries[0]) != target):
            # The stream ID of another history (records re-appended after a failover have new IDs):
            # locate the ordinal instead; the reader compares the digests.
            return self.evalsha(READ_SCRIPT, keys, (after.ordinal, "", limit), read=True)
        return [state[0], first, last, 1 if state[3] else 0, state[2] or b"", state[4] or b"", entries]

    def heads(self, keys: Sequence[tuple[bytes, bytes]]) -> list[tuple[Any, Any]]:
        commands = [
            command for meta, stream in keys for command in (("HMGET", meta, "e", "l", "i", "s", "h"), ("XLEN", stream))
        ]
        results = self._transaction(self._reader, *commands)
        return list(zip(results[::2], results[1::2], strict=True))

    def _transaction(self, pool: FairConnectionPool, *commands: tuple[Any, ...]) -> Any:
        connection = pool.acquire()
        healthy = False
        try:
            connection.send_packed_command(connection.pack_commands([("MULTI",), *commands, ("EXEC",)]))
            replies = [connection.read_response() for _ in range(len(commands) + 2)]
            healthy = True
        finally:
            pool.release(connection, healthy)
        results = replies[-1]
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def scan(self, pattern: bytes) -> Iterator[bytes]:
        cursor: Any = 0
        while True:
            cursor, keys = self._execute(self._writer, "SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            yield from keys
            if int(cursor) == 0:
                return

    def ping(self) -> None:
        self._execute(self._writer, "PING")

    def address_of(self, channel: bytes) -> str:
        return "server"

    def feed_connection(self, address: str, client_name: str) -> Any:
        return self._connect(client_name)

    def refresh_topology(self) -> None:
        pass

    def close(self) -> None:
        self._reader.close()
        self._writer.close()
        sentinel_pool = getattr(self, "_sentinel_pool", None)
        if sentinel_pool is not None:
            # The connections to the sentinels themselves (their clients ask where the primary is).
            for client in sentinel_pool.sentinel_manager.sentinels:
                client.close()


class Cluster:
    def __init__(
        self, parts: urllib.parse.SplitResult, common: dict[str, Any], read_size: int, write_size: int, name: str
    ) -> None:
        self._common = common
        self._username = urllib.parse.unquote(parts.username) if parts.username else None
        self._password = urllib.parse.unquote(parts.password) if parts.password else None
        nodes = []
        for item in parts.netloc.rpartition("@")[2].split(","):
            host, _, port = item.strip().rpartition(":")
            nodes.append((host.strip("[]") or "127.0.0.1", int(port or 6379)))
        self._reader = self._open(nodes, read_size, f"{name}:read")
        self._writer = self._open(nodes, write_size, f"{name}:write")
        self._scripts: dict[str, Any] = {}

    def _open(self, nodes: list[tuple[str, int]], size: int, client_name: str) -> Any:
        from redis import BlockingConnectionPool
        from redis.cluster import ClusterNode, RedisCluster

        node_class: Any = ClusterNode  # untyped in redis-py
        return RedisCluster(
            startup_nodes=[node_class(host, port) for host, port in nodes],
            username=self._username,
            password=self._password,
            # Only URL-built clusters honour connection_pool_class: a bounded, blocking pool per node,
            # whose waiters are served in arrival order.
            url=f"redis://{nodes[0][0]}:{nodes[0][1]}",
            connection_pool_class=functools.partial(
                BlockingConnectionPool, timeout=self._common["socket_timeout"], queue_class=FairQueue
            ),
            max_connections=size,
            client_name=client_name,
            **self._common,
        )

    def evalsha(self, script: Script, keys: Sequence[bytes], args: Sequence[Any], *, read: bool = False) -> Any:
        client = self._reader if read else self._writer
        registered = self._scripts.get(script.sha)
        if registered is None:
            registered = self._scripts[script.sha] = self._writer.register_script(script.source)
        return registered(keys=list(keys), args=list(args), client=client)

    def read(self, keys: Sequence[bytes], after: Position, limit: int) -> Any:
        return self.evalsha(READ_SCRIPT, keys, (after.ordinal, after.native, limit), read=True)

    def heads(self, keys: Sequence[tuple[bytes, bytes]]) -> list[tuple[Any, Any]]:
        # Not one transaction (the topics live in different slots): a change between a topic's two
        # commands also sends a hint, which makes the periodic check ignore this answer.
        pipeline = self._reader.pipeline(transaction=False)
        for meta, stream in keys:
            pipeline.hmget(meta, "e", "l", "i", "s", "h")
            pipeline.xlen(stream)
        results = pipeline.execute()
        return list(zip(results[::2], results[1::2], strict=True))

    def scan(self, pattern: bytes) -> Iterator[bytes]:
        yield from self._writer.scan_iter(match=pattern, count=1000)

    def ping(self) -> None:
        self._writer.ping()

    def address_of(self, channel: bytes) -> str:
        return str(self._writer.get_node_from_key(channel).name)

    def feed_connection(self, address: str, client_name: str) -> Any:
        from redis import Connection

        connection_class: Any = Connection  # untyped in redis-py
        host, _, port = address.rpartition(":")
        kwargs = {key: value for key, value in self._common.items() if key not in SSL_OPTIONS}
        return connection_class(
            host=host,
            port=int(port),
            username=self._username,
            password=self._password,
            client_name=client_name,
            **kwargs,
        )

    def refresh_topology(self) -> None:
        self._writer.nodes_manager.initialize()

    def close(self) -> None:
        for client in (self._reader, self._writer):
            with contextlib.suppress(Exception):
                client.close()


class PackedAppend:
    """The append command, encoded in RESP by hand: everything but the payload and epoch is per topic
    and constant, so it is encoded once per topic instead of once per append (redis-py's generic
    packing costs more than the rest of the client side of an append).
    """

    _CACHED_TOPICS = 4096

    def __init__(self, keys_of: Callable[[str], tuple[bytes, bytes, bytes]], max_records: int, max_age_ms: int) -> None:
        self._keys_of = keys_of
        self._limits = _bulk(str(max_records).encode()) + _bulk(str(max_age_ms).encode())
        self._heads: dict[str, bytes] = {}

    def command(self, topic: str, payload: bytes, epoch: bytes, hint: bool, expect: Position | None = None) -> bytes:
        head = self._heads.get(topic)
        if head is None:
            if len(self._heads) >= self._CACHED_TOPICS:
                self._heads.clear()
            keys = b"".join(_bulk(key) for key in self._keys_of(topic))
            head = b"*13\r\n" + _bulk(b"EVALSHA") + _bulk(APPEND_SCRIPT.sha.encode()) + _bulk(b"3") + keys
            self._heads[topic] = head
        if expect is None:
            condition = _UNCONDITIONAL
        else:
            condition = _bulk(str(expect.ordinal).encode()) + _bulk(expect.digest.encode())
        return b"%b$%d\r\n%b\r\n%b%b%b%b" % (
            head,
            len(payload),
            payload,
            _bulk(epoch),
            self._limits,
            _HINT_WITH_PAYLOAD if hint else _HINT_WITHOUT_PAYLOAD,
            condition,
        )


def _ordinal_of(entry: Any) -> int:
    fields = entry[1]
    if fields[0] == b"o":
        return int(fields[1])
    return int(dict(zip(fields[::2], fields[1::2], strict=True))[b"o"])


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


_HINT_WITH_PAYLOAD = _bulk(b"1")
_HINT_WITHOUT_PAYLOAD = _bulk(b"0")
_UNCONDITIONAL = _bulk(b"") + _bulk(b"")
