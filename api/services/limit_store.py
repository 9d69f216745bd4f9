"""Where the per-tenant limits count, across every process: the app's Redis, or the app database.

Three operations, each atomic whichever process asks:

- ``window_hit(key, limit, window)``: one event in a sliding window (run starts, passports, gateway
  streams): ``None`` if it is within ``limit``, else the seconds until the oldest counted event leaves
  the window (a refused event is not counted);
- ``amount_hit(key, limit, window, amount)``: an amount in a fixed window (gateway bytes);
- ``acquire`` / ``renew`` / ``release`` of slots of concurrency limits (open event streams: one per end
  user and one per app, taken together or not at all), held by a holder id with a lease that the holder
  renews: a dead holder's slots come back when it runs out.

Redis answers each with one Lua script (cluster-safe: one key, or the scopes of one stream, which share
a hash tag) and Redis's own clock, through at most :data:`REDIS_CALLS` calls at a time per process (a
herd of arrivals waits its turn for a few connections rather than opening hundreds); the database with
one short transaction of its own (never the caller's session) behind striped lock rows.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from sqlalchemy import Connection, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from api.models import LimitCounter, LimitEvent, LimitSlot
from api.models.engine import db
from api.models.limits import LOCK_STRIPES

__all__ = ["DatabaseLimitStore", "LimitStore", "RedisLimitStore"]

KEY_PREFIX = "limits:"
#: Redis calls one process makes at once; the others wait their turn (in order, under gevent).
REDIS_CALLS = 8
#: How long an open stream's batched script call may wait for its answer (then it is let through).
BATCH_WAIT = 10.0
logger = logging.getLogger(__name__)


class LimitStore(Protocol):
    def window_hit(self, key: str, limit: int, window: float, member: str) -> float | None: ...

    def amount_hit(self, key: str, limit: int, window: float, amount: int) -> float | None: ...

    def acquire(self, scopes: Sequence[tuple[str, int]], holder: str, lease: float) -> tuple[int, float] | None:
        """A slot of every ``(scope, limit)`` for ``holder``, or none: then the index of the first scope
        that is full and the seconds until one of its slots' lease runs out."""
        ...

    def renew(self, slots: Sequence[tuple[str, str]], lease: float) -> None: ...

    def release(self, scopes: Sequence[str], holder: str) -> None: ...

    def holders(self, scope: str) -> int: ...


_WINDOW = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], window)
return 0
"""
_AMOUNT = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
if n > tonumber(ARGV[2]) then
  redis.call('DECRBY', KEYS[1], ARGV[1])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]); ttl = tonumber(ARGV[3]) end
  return math.max(1, ttl)
end
return 0
"""
_ACQUIRE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[1])
local holder = ARGV[2]
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if not redis.call('ZSCORE', KEYS[i], holder) and redis.call('ZCARD', KEYS[i]) >= tonumber(ARGV[2 + i]) then
    local first = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    return {i, math.max(1, tonumber(first[2]) - now)}
  end
end
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now + lease, holder)
  redis.call('PEXPIRE', KEYS[i], 2 * lease)
end
return {0, 0}
"""
_RELEASE = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 0
"""
_RENEW = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], 2 * lease)
return 0
"""
_HOLDERS = """
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t[1] * 1000 + math.floor(t[2] / 1000))
return redis.call('ZCARD', KEYS[1])
"""


def _seconds(milliseconds: int) -> float | None:
    return None if milliseconds <= 0 else milliseconds / 1000


class RedisLimitStore:
    """Counts in the app's Redis (a standalone server, the Sentinel primary, or a cluster: one key per call)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._calls = threading.BoundedSemaphore(REDIS_CALLS)
        self._batches = _Batches(self)
        self._scripts = {
            name: client.register_script(source)
            for name, source in (
                ("window", _WINDOW),
                ("amount", _AMOUNT),
                ("acquire", _ACQUIRE),
                ("release", _RELEASE),
                ("renew", _RENEW),
                ("holders", _HOLDERS),
            )
        }

    def _run(self, name: str, key: str, *args: Any) -> int:
        """The script's answer; 0 (allowed) when Redis cannot be asked: a limit that is away lets traffic
        through rather than refuse it, and says so in the log."""
        from redis.exceptions import RedisError

        try:
            with self._calls:
                return int(self._scripts[name](keys=[KEY_PREFIX + key], args=list(args)))
        except RedisError as exc:
            logger.warning("limits: Redis did not answer, %s is not limited meanwhile: %s", key.split(":")[0], exc)
            return 0

    def window_hit(self, key: str, limit: int, window: float, member: str) -> float | None:
        return _seconds(self._run("window", key, limit, int(window * 1000), member))

    def amount_hit(self, key: str, limit: int, window: float, amount: int) -> float | None:
        return _seconds(self._run("amount", key, amount, limit, int(window * 1000)))

    def acquire(self, scopes: Sequence[tuple[str, int]], holder: str, lease: float) -> tuple[int, float] | None:
        """One script for all ``scopes`` (which share a hash tag: one cluster slot), sent with the other
        streams' of the same moment (:class:`_Batches`); allowed when Redis cannot be asked, as every
        limit here."""
        keys = [KEY_PREFIX + scope for scope, _ in scopes]
        answer = self._batches.ask("acquire", keys, [int(lease * 1000), holder, *[limit for _, limit in scopes]])
        if isinstance(answer, Exception):
            logger.warning("limits: Redis did not answer, open streams are not limited meanwhile: %s", answer)
            return None
        index, wait = answer
        return None if int(index) == 0 else (int(index) - 1, int(wait) / 1000)

    def renew(self, slots: Sequence[tuple[str, str]], lease: float) -> None:
        by_scope: dict[str, list[str]] = {}
        for scope, holder in slots:
            by_scope.setdefault(scope, []).append(holder)
        for scope, holders in by_scope.items():
            self._run("renew", scope, int(lease * 1000), *holders)

    def release(self, scopes: Sequence[str], holder: str) -> None:
        """Sent with the next batch, without waiting for it (a release Redis misses is its lease's to undo)."""
        self._batches.tell("release", [KEY_PREFIX + scope for scope in scopes], [holder])

    def holders(self, scope: str) -> int:
        # Through the batches: this process's releases asked before are counted (they go first).
        answer = self._batches.ask("holders", [KEY_PREFIX + scope], [])
        if isinstance(answer, Exception):
            logger.warning("limits: Redis did not answer how many streams are open: %s", answer)
            return 0
        return int(answer)


class _Ask:
    """One script call waiting for its batch: its keys and arguments, then its answer."""

    __slots__ = ("answer", "args", "done", "keys", "name")

    def __init__(self, name: str, keys: list[str], args: list[Any], done: threading.Event | None) -> None:
        self.name, self.keys, self.args, self.done = name, keys, args, done
        self.answer: Any = None


class _Batches:
    """The open-stream scripts of one process, sent to Redis together: each turn sends everything asked
    since the last one in one pipeline (one round trip), and its flusher keeps turning while more is
    asked. A herd's thousand arrivals a second then cost a few dozen round trips, not a thousand: one
    script call per arrival was 17% of the worker's CPU (docs/benchmarks.md, "Dify's readers")."""

    def __init__(self, store: RedisLimitStore) -> None:
        self._store = store
        self._pending: list[_Ask] = []
        self._lock = threading.Lock()
        self._flushing = False

    def ask(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """The script's answer, or the ``Exception`` Redis raised (or a timeout's) instead."""
        ask = _Ask(name, keys, args, threading.Event())
        self._add(ask)
        assert ask.done is not None
        if not ask.done.wait(BATCH_WAIT):
            return TimeoutError(f"no answer from Redis within {BATCH_WAIT} s")
        return ask.answer

    def tell(self, name: str, keys: list[str], args: list[Any]) -> None:
        """Send with the next batch; nobody waits for the answer."""
        self._add(_Ask(name, keys, args, None))

    def _add(self, ask: _Ask) -> None:
        with self._lock:
            self._pending.append(ask)
            if self._flushing:
                return
            self._flushing = True
        threading.Thread(target=self._flush, name="limit-batches", daemon=True).start()

    def _flush(self) -> None:
        from redis.exceptions import RedisError

        while True:
            time.sleep(0)  # the arrivals of this moment join the batch
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    self._flushing = False
                    return
            try:
                with self._store._calls:
                    pipeline = self._store._client.pipeline(transaction=False)
                    for ask in batch:
                        self._store._scripts[ask.name](keys=ask.keys, args=ask.args, client=pipeline)
                    answers = pipeline.execute(raise_on_error=False)
            except (RedisError, OSError) as exc:
                answers = [exc] * len(batch)
            for ask, answer in zip(batch, answers, strict=True):
                ask.answer = answer
                if ask.done is not None:
                    ask.done.set()
                elif isinstance(answer, Exception):
                    logger.warning("limits: a stream's slots could not be given back (their leases will): %s", answer)


@contextlib.contextmanager
def _begin() -> Iterator[Connection]:
    """A transaction of the store's own. A caller's session with nothing pending is closed first (its loaded
    objects stay readable): its connection then serves this transaction, and a request never holds two."""
    session = db.session
    if not (session.new or session.dirty or session.deleted):
        session.close()
    with db.engine.begin() as connection:
        yield connection


class DatabaseLimitStore:
    """Counts in the app database: each call one short transaction behind a striped lock row."""

    #: Every this many window hits, events of keys nobody hit again (older than any window) are dropped.
    SWEEP_EVERY = 1000
    OLDEST_WINDOW = 3600.0

    def __init__(self) -> None:
        self._hits = 0

    def _locked(self, connection: Connection, key: str) -> None:
        """Take the lock row of ``key``'s stripe for the rest of the transaction (made on first use)."""
        stripe = f"lock:{_stripe(key)}"
        taken = connection.execute(update(LimitCounter).where(LimitCounter.key == stripe).values(count=0))
        if taken.rowcount == 0:
            dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
            made = dialect.insert(LimitCounter).values(key=stripe, count=0, window_ends=0.0)
            connection.execute(made.on_conflict_do_nothing(index_elements=["key"]))
            connection.execute(update(LimitCounter).where(LimitCounter.key == stripe).values(count=0))

    def window_hit(self, key: str, limit: int, window: float, member: str) -> float | None:
        now = time.time()
        with _begin() as connection:
            self._locked(connection, key)
            connection.execute(delete(LimitEvent).where(LimitEvent.key == key, LimitEvent.at <= now - window))
            self._hits += 1
            if self._hits % self.SWEEP_EVERY == 0:
                connection.execute(delete(LimitEvent).where(LimitEvent.at <= now - self.OLDEST_WINDOW))
            count, oldest = connection.execute(
                select(func.count(), func.min(LimitEvent.at)).where(LimitEvent.key == key)
            ).one()
            if count >= limit:
                return max(0.001, float(oldest) + window - now)
            connection.execute(LimitEvent.__table__.insert().values(key=key, at=now))
        return None

    def amount_hit(self, key: str, limit: int, window: float, amount: int) -> float | None:
        now = time.time()
        with _begin() as connection:
            self._locked(connection, key)
            row = connection.execute(
                select(LimitCounter.count, LimitCounter.window_ends).where(LimitCounter.key == key)
            ).one_or_none()
            count, ends = (0, now + window) if row is None or row[1] <= now else (int(row[0]), float(row[1]))
            if count + amount > limit:
                return max(0.001, ends - now)
            if row is None:
                connection.execute(LimitCounter.__table__.insert().values(key=key, count=amount, window_ends=ends))
            else:
                connection.execute(
                    update(LimitCounter).where(LimitCounter.key == key).values(count=count + amount, window_ends=ends)
                )
        return None

    def acquire(self, scopes: Sequence[tuple[str, int]], holder: str, lease: float) -> tuple[int, float] | None:
        now = time.time()
        with _begin() as connection:
            # Every scope's stripe, in one order whoever asks: two streams never wait for each other's.
            for stripe_of in sorted({scope for scope, _ in scopes}, key=_stripe):
                self._locked(connection, stripe_of)
            wanted = []
            for index, (scope, limit) in enumerate(scopes):
                connection.execute(delete(LimitSlot).where(LimitSlot.scope == scope, LimitSlot.expires_at <= now))
                mine = connection.execute(
                    update(LimitSlot)
                    .where(LimitSlot.scope == scope, LimitSlot.holder == holder)
                    .values(expires_at=now + lease)
                )
                if mine.rowcount:
                    continue
                count, first = connection.execute(
                    select(func.count(), func.min(LimitSlot.expires_at)).where(LimitSlot.scope == scope)
                ).one()
                if count >= limit:  # nothing taken: what ran is expiry, and renewing slots already ours
                    return index, max(0.001, float(first) - now)
                wanted.append(scope)
            for scope in wanted:
                connection.execute(
                    LimitSlot.__table__.insert().values(scope=scope, holder=holder, expires_at=now + lease)
                )
        return None

    def renew(self, slots: Sequence[tuple[str, str]], lease: float) -> None:
        if not slots:
            return
        expires = time.time() + lease
        with _begin() as connection:
            for scope, holder in slots:
                connection.execute(
                    update(LimitSlot)
                    .where(LimitSlot.scope == scope, LimitSlot.holder == holder)
                    .values(expires_at=expires)
                )

    def release(self, scopes: Sequence[str], holder: str) -> None:
        with _begin() as connection:
            connection.execute(delete(LimitSlot).where(LimitSlot.scope.in_(list(scopes)), LimitSlot.holder == holder))

    def holders(self, scope: str) -> int:
        with _begin() as connection:
            found = connection.execute(
                select(func.count()).where(LimitSlot.scope == scope, LimitSlot.expires_at > time.time())
            ).scalar_one()
        return int(found)


def ceil_seconds(seconds: float) -> int:
    """A Retry-After in whole seconds: at least 1, never early."""
    return max(1, math.ceil(seconds))


def _stripe(key: str) -> int:
    return zlib.crc32(key.encode()) % LOCK_STRIPES
