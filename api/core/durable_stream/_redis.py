"""Redis Streams adapter (standalone Redis and Redis Cluster).

Capability card
---------------
- URL: ``redis://[user:password@]host:port/db``, ``rediss://…`` (TLS), or
  ``redis+cluster://[user:password@]host1:port1,host2:port2,…`` (any reachable nodes of one
  cluster; the rest is discovered). Needs Redis ≥ 7.0 (sharded pub/sub) and redis-py (hiredis).
- Storage: per topic a stream ``{<key_prefix><topic>}:s`` (fields ``o`` ordinal, ``p`` payload) and
  a hash ``{<key_prefix><topic>}:m`` (epoch, last ordinal, last stream ID, sealed). The hash tag
  keeps a topic in one cluster slot. Topic names containing ``{``/``}`` or starting with ``#`` use
  a digest of the name as the tag instead. Every operation is one Lua script (``EVALSHA``):
  atomic ordinals, seal, trims and reads from one snapshot. ``XDEL``, ``$`` and ``0-0`` are never
  used; the tail is the stream's last generated ID, kept in the hash by the append script.
- Durability: whatever the server is configured for (RDB/AOF, ``appendfsync``, replicas). A server
  that restarts without its data gives every topic a new epoch: old cursors fail with
  ``CursorUnavailableError`` instead of silently reading a different history.
- Wake-ups: each script ``SPUBLISH``es a hint on the topic's sharded channel; one listener thread per
  backend object keeps one dedicated connection per node (no retries, health-checked) subscribed
  to the watched topics, and prefetches just-appended records for readers at the tail (see
  :mod:`._redis_feed`). In plain threads the only waiting subscription reads those connections
  itself, saving a thread hand-over per record. Beside it, every ``poll_interval`` (1 s) one
  pipelined round trip per node and 64 topics checks the heads of all watched topics, and wakes
  those that changed without a hint (expiry, keys deleted by hand, a lost hint); an idle
  subscription costs nothing in between.
- Options:
  ``key_prefix`` (default ``ds:``; must not contain ``{`` or ``}``),
  ``max_records`` (exact ``MAXLEN`` on every append and in ``enforce_retention()``),
  ``max_age_seconds`` (``MINID`` trim on every append and in ``enforce_retention()``, and a key TTL
  refreshed by appends and seals, so an idle topic disappears entirely),
  ``buffer_size`` (records per subscription, default 128),
  ``read_connections`` (pool shared by all subscriptions' reads, default 3),
  ``max_connections`` (pool for appends and other commands, default 16; with Redis Cluster both
  sizes are per node; every pool serves waiting callers in arrival order, so a ``seal()`` behind
  appenders in a tight loop gets its turn, in threads and under gevent),
  ``socket_timeout`` (default 5 s), ``socket_connect_timeout`` (default 2 s),
  ``prefetch`` (default true), ``hint_payload_limit`` (largest payload copied into a hint,
  default 16384 bytes; 0 sends wake-ups only), ``poll_interval`` (default 1 s: how often the
  heads of watched topics are checked for changes that sent no hint),
  ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs`` (``rediss://`` only).
- Limits: a topic is one stream, so one topic's throughput is bounded by one node. Every Redis
  error (refused or reset connection, timeout, ``CLUSTERDOWN``, ``OOM``) surfaces as
  ``DurableStreamUnavailableError``; an ``append`` that fails may or may not have been stored.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import queue
import re
import secrets
import select
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from . import _redis_scripts as scripts
from ._connect import Options
from ._contract import CursorUnavailableError, DurableStreamError, DurableStreamUnavailableError, TopicSealedError
from ._driver import Batch, ChangeFeed, Position, StoredRecord, TopicHead, TopicInfo
from ._fair import FairSemaphore
from ._redis_feed import Feed, Prefetch

__all__ = ["RedisDriver", "open_driver"]

T = TypeVar("T")

DEFAULT_KEY_PREFIX = "ds:"
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_EMPTY_PREFIX = "e:"
_EMPTY_POSITION = re.compile(r"e:[0-9a-f]{1,64}")
#: How long a command waits for a free pooled connection: many readers sharing a few connections
#: queue here under load, which is slower but not a failure.
_POOL_WAIT = 30.0
_SSL_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")


def _translate(operation: str, call: Callable[[], T]) -> T:
    """Run ``call``; the one place where redis-py's exceptions become contract errors."""
    try:
        return call()
    except DurableStreamError:
        raise
    except Exception as exc:
        raise DurableStreamUnavailableError(f"Redis {operation} failed: {exc}") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class _Script:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> _Script:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())


_APPEND = _Script.of(scripts.APPEND)
_SEAL = _Script.of(scripts.SEAL)
_HEAD = _Script.of(scripts.HEAD)
_READ = _Script.of(scripts.READ)
_INFO = _Script.of(scripts.INFO)
_TRIM = _Script.of(scripts.TRIM)
_RETAIN = _Script.of(scripts.RETAIN)
_DELETE = _Script.of(scripts.DELETE)


class _Deployment(Protocol):
    """What the driver needs from standalone Redis or from a cluster."""

    def evalsha(self, script: _Script, keys: Sequence[bytes], args: Sequence[Any], *, read: bool = False) -> Any: ...

    def read(self, keys: Sequence[bytes], after: Position, limit: int) -> Any:
        """The READ script's reply: ``{epoch, first, last, sealed, last id, entries}`` or empty."""
        ...

    def heads(self, keys: Sequence[tuple[bytes, bytes]]) -> list[tuple[Any, Any]]:
        """``(HMGET meta e l i s, XLEN stream)`` for each ``(meta, stream)``, in one round trip per node."""
        ...

    def scan(self, pattern: bytes) -> Iterator[bytes]: ...

    def ping(self) -> None: ...

    def address_of(self, channel: bytes) -> str: ...

    def feed_connection(self, address: str, client_name: str) -> Any: ...

    def refresh_topology(self) -> None: ...

    def close(self) -> None: ...


class _ConnectionPool:
    """A small bounded, blocking pool of redis-py connections, checked for a closed socket on checkout.

    It replaces redis-py's client and pool layers on the hot path (they cost several times the
    round trip itself on a small machine) but keeps redis-py's connections and hiredis parser.
    A checkout takes one of ``size`` turns from a :class:`~._fair.FairSemaphore`, then the most
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
        self._timeout = max(timeout, _POOL_WAIT)

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
        if not _idle_socket_healthy(connection):
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


class _FairQueue:
    """The queue of connections inside redis-py's ``BlockingConnectionPool`` (cluster mode), made fair.

    redis-py's default ``LifoQueue`` lets a caller that puts a connection back and at once asks
    again take it before the waiter it woke runs; under gevent that starves the waiter (a seal
    behind appenders) until the pool's timeout. Items wait in LIFO order (warm connections first,
    then redis-py's ``None`` placeholders); callers are served FIFO by a :class:`~._fair.FairSemaphore`
    counting them. Only what ``BlockingConnectionPool`` uses is implemented.
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


def _idle_socket_healthy(connection: Any) -> bool:
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return True  # not connected yet: it connects on first use
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable  # an idle connection has nothing to read unless the server hung up


class _Standalone:
    def __init__(self, url: str, common: dict[str, Any], read_size: int, write_size: int, name: str) -> None:
        from redis import ConnectionPool

        # Only URL parsing (host, port, db, credentials, TLS) is taken from redis-py's pool.
        template = ConnectionPool.from_url(url, **common)
        self._connection_class = template.connection_class
        self._kwargs = dict(template.connection_kwargs)
        timeout = float(common["socket_timeout"])
        self._reader = _ConnectionPool(lambda: self._connect(f"{name}:read"), read_size, timeout)
        self._writer = _ConnectionPool(lambda: self._connect(f"{name}:write"), write_size, timeout)

    def _connect(self, client_name: str) -> Any:
        return self._connection_class(**{**self._kwargs, "client_name": client_name})

    def _execute(self, pool: _ConnectionPool, *args: Any) -> Any:
        return self._roundtrip(pool, None, args)

    def _roundtrip(self, pool: _ConnectionPool, packed: bytes | None, args: Sequence[Any] = ()) -> Any:
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

    def evalsha_packed(self, script: _Script, command: bytes) -> Any:
        """Run an ``EVALSHA`` of ``script`` that :class:`_PackedAppend` encoded, on a write connection."""
        return self._loading(script, self._writer, lambda: self._roundtrip(self._writer, command))

    def evalsha(self, script: _Script, keys: Sequence[bytes], args: Sequence[Any], *, read: bool = False) -> Any:
        pool = self._reader if read else self._writer
        return self._loading(script, pool, lambda: self._execute(pool, "EVALSHA", script.sha, len(keys), *keys, *args))

    def _loading(self, script: _Script, pool: _ConnectionPool, run: Callable[[], Any]) -> Any:
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
            ("HMGET", meta, "e", "l", "i", "s"),
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
            return self.evalsha(_READ, keys, (after.ordinal, "", limit), read=True)
        return [state[0], first, last, 1 if state[3] else 0, state[2] or b"", entries]

    def heads(self, keys: Sequence[tuple[bytes, bytes]]) -> list[tuple[Any, Any]]:
        commands = [
            command for meta, stream in keys for command in (("HMGET", meta, "e", "l", "i", "s"), ("XLEN", stream))
        ]
        results = self._transaction(self._reader, *commands)
        return list(zip(results[::2], results[1::2], strict=True))

    def _transaction(self, pool: _ConnectionPool, *commands: tuple[Any, ...]) -> Any:
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


class _Cluster:
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
                BlockingConnectionPool, timeout=self._common["socket_timeout"], queue_class=_FairQueue
            ),
            max_connections=size,
            client_name=client_name,
            **self._common,
        )

    def evalsha(self, script: _Script, keys: Sequence[bytes], args: Sequence[Any], *, read: bool = False) -> Any:
        client = self._reader if read else self._writer
        registered = self._scripts.get(script.sha)
        if registered is None:
            registered = self._scripts[script.sha] = self._writer.register_script(script.source)
        return registered(keys=list(keys), args=list(args), client=client)

    def read(self, keys: Sequence[bytes], after: Position, limit: int) -> Any:
        return self.evalsha(_READ, keys, (after.ordinal, after.native, limit), read=True)

    def heads(self, keys: Sequence[tuple[bytes, bytes]]) -> list[tuple[Any, Any]]:
        # Not one transaction (the topics live in different slots): a change between a topic's two
        # commands also sends a hint, which makes the periodic check ignore this answer.
        pipeline = self._reader.pipeline(transaction=False)
        for meta, stream in keys:
            pipeline.hmget(meta, "e", "l", "i", "s")
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
        kwargs = {key: value for key, value in self._common.items() if key not in _SSL_OPTIONS}
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


class _PackedAppend:
    """The append command, encoded in RESP by hand: everything but the payload and epoch is per topic
    and constant, so it is encoded once per topic instead of once per append (redis-py's generic
    packing costs more than the rest of the client side of an append).
    """

    _CACHED_TOPICS = 4096

    def __init__(self, keys_of: Callable[[str], tuple[bytes, bytes, bytes]], max_records: int, max_age_ms: int) -> None:
        self._keys_of = keys_of
        self._limits = _bulk(str(max_records).encode()) + _bulk(str(max_age_ms).encode())
        self._heads: dict[str, bytes] = {}

    def command(self, topic: str, payload: bytes, epoch: bytes, hint: bool) -> bytes:
        head = self._heads.get(topic)
        if head is None:
            if len(self._heads) >= self._CACHED_TOPICS:
                self._heads.clear()
            keys = b"".join(_bulk(key) for key in self._keys_of(topic))
            head = b"*11\r\n" + _bulk(b"EVALSHA") + _bulk(_APPEND.sha.encode()) + _bulk(b"3") + keys
            self._heads[topic] = head
        return b"%b$%d\r\n%b\r\n%b%b%b" % (
            head,
            len(payload),
            payload,
            _bulk(epoch),
            self._limits,
            _HINT_WITH_PAYLOAD if hint else _HINT_WITHOUT_PAYLOAD,
        )


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


_HINT_WITH_PAYLOAD = _bulk(b"1")
_HINT_WITHOUT_PAYLOAD = _bulk(b"0")


class RedisDriver:
    #: A subscription's own re-read without any wake-up, a last resort: the change feed checks the
    #: heads of all watched topics every ``poll_interval`` option seconds and wakes those that changed.
    poll_interval = 15.0

    def __init__(self, url: str, options: Options) -> None:
        parts = urllib.parse.urlsplit(url)
        cluster = parts.scheme.lower() == "redis+cluster"
        prefix = options.pop_str("key_prefix", DEFAULT_KEY_PREFIX)
        assert prefix is not None
        if "{" in prefix or "}" in prefix:
            raise ValueError("option 'key_prefix' must not contain '{' or '}'")
        self._prefix = prefix
        self._max_records = options.pop_int("max_records", minimum=1) or 0
        max_age = options.pop_float("max_age_seconds", minimum=0.001)
        self._max_age_ms = 0 if max_age is None else max(1, round(max_age * 1000))
        read_connections = options.pop_int("read_connections", 3, minimum=1)
        max_connections = options.pop_int("max_connections", 16, minimum=1)
        socket_timeout = options.pop_float("socket_timeout", 5.0, minimum=0.01)
        connect_timeout = options.pop_float("socket_connect_timeout", 2.0, minimum=0.01)
        sweep_interval = options.pop_float("poll_interval", 1.0, minimum=0.01)
        assert sweep_interval is not None
        self._sweep_interval = sweep_interval
        self.poll_interval = max(RedisDriver.poll_interval, 10 * sweep_interval)
        prefetch = options.pop_bool("prefetch", True)
        hint_limit = options.pop_int("hint_payload_limit", 16384, minimum=0)
        assert read_connections and max_connections and socket_timeout and connect_timeout and hint_limit is not None
        ssl: dict[str, Any] = {}
        for name in _SSL_OPTIONS:
            value = options.pop_str(name)
            if value is not None:
                ssl[name] = value
        if ssl and parts.scheme.lower() != "rediss":
            raise ValueError(f"options {', '.join(sorted(ssl))} need a rediss:// URL")
        self.identity = f"redis:{prefix}"
        self._hint_limit = hint_limit
        # Prefetched records older than this are not handed out: with max_age_seconds the topic may
        # have expired meanwhile. Without it they stay exact however old (a chain of stream IDs proves
        # them), and a short limit would only turn a lagging reader's hits into reads from Redis.
        max_age_hint = 60.0 if max_age is None else min(1.0, max_age / 4)
        # The feed's periodic check renews a mirrored head every sweep_interval; an older one is not used.
        # With key TTLs a topic can expire without a hint, so a mirror is trusted no longer than a record.
        mirror_age = 3 * sweep_interval if max_age is None else min(3 * sweep_interval, max_age_hint)
        self._prefetch = Prefetch(max_age=max_age_hint, mirror_age=mirror_age) if prefetch else None
        self._name = f"durable-stream-{secrets.token_hex(3)}"
        self._feed_lock = threading.Lock()
        self._feeds: list[Feed] = []

        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries anywhere: a retried append could store a record twice without anyone knowing,
        # and a dead server must surface promptly instead of after rounds of back-off.
        common: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(NoBackoff(), 0),
            "protocol": 2,
            **ssl,
        }
        self._redis: _Deployment = _translate(
            "connect",
            lambda: (
                _Cluster(parts, common, read_connections, max_connections, self._name)
                if cluster
                else _Standalone(url, common, read_connections, max_connections, self._name)
            ),
        )
        self._standalone = self._redis if isinstance(self._redis, _Standalone) else None
        self._packed_append = _PackedAppend(self._keys, self._max_records, self._max_age_ms)
        try:
            _translate("connect", self._redis.ping)
        except BaseException:
            self.close()
            raise

    # -- keys -------------------------------------------------------------------------------

    def _keys(self, topic: str) -> tuple[bytes, bytes, bytes]:
        if "{" in topic or "}" in topic or topic.startswith("#"):
            digest = hashlib.blake2b(topic.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
            tag = f"{self._prefix}#{digest}"
        else:
            tag = self._prefix + topic
        base = b"{" + tag.encode("utf-8", "surrogatepass") + b"}:"
        return base + b"m", base + b"s", base + b"n"

    def _channel(self, topic: str) -> bytes:
        return self._keys(topic)[2]

    def _eval(self, operation: str, script: _Script, topic: str, args: Sequence[Any], *, read: bool = False) -> Any:
        keys = self._keys(topic)
        return _translate(operation, lambda: self._redis.evalsha(script, keys, args, read=read))

    # -- Driver -----------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes) -> None:
        hint = len(payload) <= self._hint_limit
        epoch = _new_epoch()
        standalone, packed = self._standalone, self._packed_append
        if standalone is not None:
            command = packed.command(topic, payload, epoch.encode(), hint)
            reply = _translate("append", lambda: standalone.evalsha_packed(_APPEND, command))
        else:
            args = (payload, epoch, self._max_records, self._max_age_ms, "1" if hint else "0")
            reply = self._eval("append", _APPEND, topic, args)
        if reply[0] == 0:
            raise TopicSealedError(f"topic {topic!r} is sealed")
        if self._prefetch is not None:
            _, epoch, ordinal, native, first, previous = reply
            self._prefetch.put(
                topic, epoch.decode(), int(ordinal), native.decode(), previous.decode(), int(first), payload
            )

    def seal(self, topic: str) -> None:
        self._eval("seal", _SEAL, topic, (_new_epoch(), self._max_age_ms))
        if self._prefetch is not None:
            self._prefetch.invalidate(topic)  # its hint follows; until then nobody trusts the old head

    def head(self, topic: str, *, create: bool) -> TopicHead | None:
        reply = self._eval("head", _HEAD, topic, ("1" if create else "0", _new_epoch(), self._max_age_ms))
        return _parse_head(reply)

    def read(self, topic: str, after: Position, limit: int) -> Batch:
        if self._prefetch is not None:
            prefetched = self._prefetch.lookup(topic, after, limit)
            if prefetched is not None:
                return prefetched
        if after.native and not _STREAM_ID.fullmatch(after.native):
            if not _EMPTY_POSITION.fullmatch(after.native):
                raise CursorUnavailableError("malformed cursor position")
            after = Position(after.ordinal)  # before the first record: read from the start
        keys = self._keys(topic)
        stamp = None if self._prefetch is None else self._prefetch.stamp(topic)
        reply = _translate("read", lambda: self._redis.read(keys, after, limit))
        head = _parse_head(reply)
        if head is None:
            return Batch(head=None, records=())
        if stamp is not None and self._prefetch is not None:
            self._prefetch.observe(topic, stamp, head)
        return Batch(head=head, records=[_parse_record(entry) for entry in reply[5]])

    def _heads(self, topics: list[str]) -> list[TopicHead | None]:
        """The heads of many topics at once, for the change feed's periodic check."""
        keys = [self._keys(topic)[:2] for topic in topics]
        replies = _translate("head check", lambda: self._redis.heads(keys))
        heads: list[TopicHead | None] = []
        for (epoch, last, last_native, sealed), length in replies:
            if epoch is None:
                heads.append(None)
                continue
            ordinal = int(last or 0)
            heads.append(_parse_head([epoch, ordinal - int(length) + 1, ordinal, sealed, last_native or b""]))
        return heads

    def topic_info(self, topic: str) -> TopicInfo | None:
        reply = self._eval("topic info", _INFO, topic, ())
        if not reply:
            return None
        length, first, last, sealed, epoch = reply
        return TopicInfo(topic, int(length), int(first), int(last), bool(sealed), epoch.decode())

    def trim(self, topic: str, keep_last: int) -> int:
        removed, first = self._eval("trim", _TRIM, topic, (keep_last,))
        if self._prefetch is not None and removed:
            self._prefetch.trimmed(topic, int(first))
        return int(removed)

    def delete(self, topic: str) -> bool:
        existed = self._eval("delete", _DELETE, topic, ())
        if self._prefetch is not None:
            self._prefetch.deleted(topic)
        return bool(existed)

    def enforce_retention(self) -> int:
        if not self._max_records and not self._max_age_ms:
            return 0
        pattern = b"{" + _glob_escape(self._prefix.encode("utf-8", "surrogatepass")) + b"*}:m"
        args = (self._max_records, self._max_age_ms)
        removed = 0

        def trim_all() -> None:
            nonlocal removed
            for meta in self._redis.scan(pattern):
                base = meta[:-1]
                count, _ = self._redis.evalsha(_RETAIN, (meta, base + b"s", base + b"n"), args)
                removed += int(count)

        _translate("retention", trim_all)
        if removed and self._prefetch is not None:
            self._prefetch.clear()  # which topics lost records is not worth a reverse lookup here
        return removed

    def open_change_feed(self, notify: Callable[[str], None]) -> ChangeFeed | None:
        redis = self._redis
        name = f"{self._name}:feed"
        feed = Feed(
            notify=notify,
            prefetch=self._prefetch if self._prefetch is not None else Prefetch(per_topic=0),
            channel_of=self._channel,
            address_of=redis.address_of,
            connect=lambda address: redis.feed_connection(address, name),
            refresh_topology=redis.refresh_topology,
            sweep=self._heads,
            sweep_interval=self._sweep_interval,
            name=name,
        )
        with self._feed_lock:
            self._feeds.append(feed)
        return feed

    def close(self) -> None:
        with self._feed_lock:
            feeds, self._feeds = self._feeds, []
        for feed in feeds:
            feed.close()
        deployment = getattr(self, "_redis", None)
        if deployment is not None:
            with contextlib.suppress(Exception):  # closing must not raise; the sockets are gone either way
                deployment.close()


def _new_epoch() -> str:
    return secrets.token_hex(8)


def _parse_head(reply: Any) -> TopicHead | None:
    if not reply:
        return None
    epoch, first, last, sealed, last_native = reply[:5]
    native = last_native.decode()
    if not native and int(last) == 0:
        # Before the first record there is no stream ID: ``e:<epoch>`` names that position, so the
        # first record's hint (which carries it as its predecessor) can be matched exactly too.
        native = _EMPTY_PREFIX + epoch.decode()
    return TopicHead(
        epoch=epoch.decode(),
        first=int(first),
        last=int(last),
        sealed=bool(sealed),
        last_native=native,
    )


def _parse_record(entry: Any) -> StoredRecord:
    native, fields = entry
    if fields[0] == b"o" and fields[2] == b"p":
        return StoredRecord(int(fields[1]), native.decode(), fields[3])
    values = dict(zip(fields[::2], fields[1::2], strict=True))
    return StoredRecord(int(values[b"o"]), native.decode(), values[b"p"])


def _glob_escape(text: bytes) -> bytes:
    return re.sub(rb"([\\*?\[\]])", rb"\\\1", text)


def open_driver(url: str, options: Options) -> RedisDriver:
    return RedisDriver(url, options)
