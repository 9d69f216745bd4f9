"""The durable-stream tests' one way inside the library.

Tests use the public API (``connect``, topics, subscriptions) and ``backend.admin`` first. What can
only be observed or provoked from inside (which driver and change feed a backend runs, a Redis
topic's keys, who reads the Redis change feed's links, a lost hint) goes through the functions
here: this module is the only test code that touches the library's internals, so a change of
internals is answered here and nowhere else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from api.core.durable_stream import DurableStreamBackend
from api.core.durable_stream.testing.probes import WAIT_FRAMES, gevent_active, is_waiting, registered_topics

if TYPE_CHECKING:
    from api.core.durable_stream.adapters.redis.driver import RedisDriver
    from api.core.durable_stream.adapters.redis.feed import RedisChangeFeed
    from api.core.durable_stream.adapters.redis.links import FeedLink
    from api.core.durable_stream.adapters.sqlite.driver import SqliteDriver
    from api.core.durable_stream.adapters.sqlite.feed import SqliteChangeFeed


__all__ = ["WAIT_FRAMES", "gevent_active", "is_waiting", "registered_topics"]  # and the functions below

# -- every adapter ------------------------------------------------------------------------------


def driver(backend: DurableStreamBackend) -> Any:
    """The adapter's driver behind ``backend``."""
    return backend._engine.driver


def identity(backend: DurableStreamBackend) -> str:
    """The store identity cursors are bound to (equal for every backend object of one store)."""
    return str(driver(backend).identity)


def change_feed(backend: DurableStreamBackend) -> Any:
    """The backend's change feed, ``None`` before the first subscription (or for memory://)."""
    return backend._engine.notifier._feed


def subscription_transitions() -> Any:
    """The lock every subscription's enter and close take (held across a fork in a test)."""
    from api.core.durable_stream import _subscription

    return _subscription._TRANSITIONS


# -- SQLite -------------------------------------------------------------------------------------


def sqlite_driver(backend: DurableStreamBackend) -> SqliteDriver:
    from api.core.durable_stream.adapters.sqlite.driver import SqliteDriver

    found = driver(backend)
    assert isinstance(found, SqliteDriver)
    return found


def sqlite_feed(backend: DurableStreamBackend) -> SqliteChangeFeed | None:
    from api.core.durable_stream.adapters.sqlite.feed import SqliteChangeFeed

    feed = change_feed(backend)
    assert feed is None or isinstance(feed, SqliteChangeFeed)
    return feed


def sqlite_pragma(backend: DurableStreamBackend, name: str) -> Any:
    """A ``PRAGMA`` as the writer connection sees it."""
    return sqlite_driver(backend)._writer.execute(f"PRAGMA {name}").fetchone()[0]


def sqlite_settings(backend: DurableStreamBackend) -> Any:
    return sqlite_driver(backend)._settings


def silence_sqlite_feed(feed: SqliteChangeFeed) -> None:
    """Let the poller see changes but wake nobody: every wake-up it would give is lost."""
    feed._notify = lambda topic: None


def sqlite_feed_polling(feed: SqliteChangeFeed) -> bool:
    """Whether the SQLite poller is active (something is watched) rather than parked."""
    return feed._active.is_set()


# -- Redis --------------------------------------------------------------------------------------


def redis_driver(backend: DurableStreamBackend) -> RedisDriver:
    from api.core.durable_stream.adapters.redis.driver import RedisDriver

    found = driver(backend)
    assert isinstance(found, RedisDriver)
    return found


def redis_keys(backend: DurableStreamBackend, topic: str) -> tuple[bytes, bytes, bytes]:
    """The topic's metadata hash, stream and hint channel."""
    return redis_driver(backend)._keys(topic)


def redis_settings(backend: DurableStreamBackend) -> Any:
    return redis_driver(backend)._settings


def redis_prefetching(backend: DurableStreamBackend) -> bool:
    return redis_driver(backend)._prefetch is not None


def redis_feeds(backend: DurableStreamBackend) -> list[RedisChangeFeed]:
    return list(redis_driver(backend)._feeds)


def redis_change_feed_class() -> type[RedisChangeFeed]:
    """The Redis change feed's class (to slow one of its steps down with ``monkeypatch``)."""
    from api.core.durable_stream.adapters.redis.feed import RedisChangeFeed

    return RedisChangeFeed


def redis_feed(backend: DurableStreamBackend) -> RedisChangeFeed:
    from api.core.durable_stream.adapters.redis.feed import RedisChangeFeed

    feed = redis_feeds(backend)[0]
    assert isinstance(feed, RedisChangeFeed)
    return feed


def count_redis_head_checks(backend: DurableStreamBackend) -> list[list[str]]:
    """Record the topics of every periodic head check of the change feed (the real check still runs)."""
    found = redis_driver(backend)
    made: list[list[str]] = []
    original = found._heads

    def counted(topics: list[str]) -> Any:
        made.append(list(topics))
        return original(topics)

    found._heads = counted  # type: ignore[method-assign]
    return made


def count_redis_reads(backend: DurableStreamBackend) -> Callable[[], int]:
    """Count the reads that reach Redis, by wrapping the deployment's read (the real one still runs)."""
    counter = [0]
    deployment = redis_driver(backend)._redis
    original = deployment.read

    def counted(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return original(*args, **kwargs)

    deployment.read = counted
    return lambda: counter[0]


def links_reader(feed: RedisChangeFeed) -> int:
    """The thread ident of whoever holds the feed's baton (reads its links), 0 if nobody."""
    return feed._reader


def listener_thread(feed: RedisChangeFeed) -> threading.Thread:
    return feed._thread


def listener_reads(feed: RedisChangeFeed) -> bool:
    return feed._reader == feed._thread.ident


def feed_links(feed: RedisChangeFeed) -> dict[str, FeedLink]:
    return dict(feed._links)


def wake_listener(feed: RedisChangeFeed) -> None:
    """Interrupt the links' ``select()`` (as a watch or a close does)."""
    feed._wake()


def leave_listener_call(feed: RedisChangeFeed) -> None:
    """A call for the listener left over while a subscription keeps reading the links."""
    feed._vacated.set()


def intercept_redis_hints(
    feed: RedisChangeFeed, handler: Callable[[Callable[[str, bytes], None], str, bytes], None]
) -> None:
    """Route every hint the feed reads through ``handler(deliver, topic, message)`` from now on."""
    deliver = feed.deliver_hint

    def intercepted(topic: str, message: bytes) -> None:
        handler(deliver, topic, message)

    feed.deliver_hint = intercepted  # type: ignore[method-assign]


# -- PostgreSQL ---------------------------------------------------------------------------------


def postgres_engine(backend: DurableStreamBackend) -> Any:
    """The SQLAlchemy engine of the driver's pool."""
    return driver(backend)._engine


def postgres_listening(backend: DurableStreamBackend) -> tuple[int | None, set[str]]:
    """The backend pid of the change feed's hint connection and the channels it has ``LISTEN``-ed on."""
    hints = driver(backend)._hints
    if hints._conn is None:
        return None, set()
    return hints._own_pid, set(hints._listening)


# -- cursors ------------------------------------------------------------------------------------


def cursor_codec(backend: DurableStreamBackend, topic: str) -> Any:
    """The codec of ``topic``'s cursors (to decode a cursor's position, or forge one)."""
    from api.core.durable_stream._cursor import CursorCodec

    return CursorCodec(identity(backend), topic)


def redis_client_name(backend: DurableStreamBackend) -> str:
    """The prefix of the Redis ``CLIENT SETNAME`` of the backend's connections."""
    return str(redis_driver(backend)._name)


# -- NATS ---------------------------------------------------------------------------------------


def nats_consumer_count(backend: DurableStreamBackend) -> int:
    """JetStream consumers on the backend's stream (server-side state)."""
    return int(driver(backend).consumer_count())


def nats_subject(backend: DurableStreamBackend, topic: str) -> str:
    """The JetStream subject of ``topic``."""
    from api.core.durable_stream.adapters.nats.topics import subject_token

    return f"{driver(backend)._settings.subject_prefix}.{subject_token(topic)}"


def nats_minimum_version(monkeypatch: Any, version: tuple[int, int, int]) -> None:
    """Make the adapter demand ``version`` of the server (to see an old server refused)."""
    from api.core.durable_stream.adapters.nats import jetstream

    monkeypatch.setattr(jetstream, "MIN_SERVER_VERSION", version)


def nats_stream_leader(backend: DurableStreamBackend) -> str:
    """The ``server_name`` of the node leading the backend's stream (clusters)."""
    return str(driver(backend).stream_leader())


def nats_prefetched(backend: DurableStreamBackend, topic: str) -> int:
    """How many republished messages of ``topic`` the backend object holds for readers at the tail."""
    conn = driver(backend)._connection()
    return int(conn.prefetch.size(conn.topics.subject(topic)))


# -- forks: a store that forgets its last records, as a failover to a replica behind leaves it ---------


def memory_lose_last_records(backend: DurableStreamBackend, name: str, count: int) -> None:
    state = driver(backend)._topics[name]
    assert len(state.records) > count, "keep at least one record: the digest before them is a record's"
    del state.records[-count:]
    state.last_digest = state.records[-1][2]
    state.sealed = False


def sqlite_lose_last_records(backend: DurableStreamBackend, name: str, count: int) -> None:
    def work(connection: Any) -> None:
        topic_id, last = connection.execute("SELECT id, last_seq FROM topics WHERE name = ?", (name,)).fetchone()
        keep = last - count
        connection.execute("DELETE FROM records WHERE topic_id = ? AND seq > ?", (topic_id, keep))
        (digest,) = connection.execute(
            "SELECT digest FROM records WHERE topic_id = ? AND seq = ?", (topic_id, keep)
        ).fetchone()
        connection.execute(
            "UPDATE topics SET last_seq = ?, last_digest = ?, sealed = 0 WHERE id = ?", (keep, digest, topic_id)
        )

    sqlite_driver(backend)._write("lose records", work)


_REDIS_LOSE = r"""
local meta, stream = KEYS[1], KEYS[2]
local count = tonumber(ARGV[1])
local entries = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', count + 1)
for index = 1, count do redis.call('XDEL', stream, entries[index][1]) end
local keep = entries[count + 1]
local fields, ordinal, digest = keep[2], nil, ''
for index = 1, #fields, 2 do
  if fields[index] == 'o' then ordinal = fields[index + 1] end
  if fields[index] == 'h' then digest = fields[index + 1] end
end
redis.call('HSET', meta, 'l', ordinal, 'i', keep[1], 'h', digest)
redis.call('HDEL', meta, 's')
return 1
"""


def redis_lose_last_records(backend: DurableStreamBackend, name: str, count: int) -> None:
    """What a replica promoted before it had the last ``count`` appends holds (its stream IDs go on after
    the lost ones, as the replica's clock would); this process's prefetch forgets them, as its broken
    links to the old primary would make it."""
    from api.core.durable_stream.adapters.redis.scripts import Script

    found = redis_driver(backend)
    found._redis.evalsha(Script.of(_REDIS_LOSE), found._keys(name), [count])
    if found._prefetch is not None:
        found._prefetch.clear()


def postgres_lose_last_records(backend: DurableStreamBackend, name: str, count: int) -> None:
    from sqlalchemy import text

    found = driver(backend)
    s = f'"{found._schema}"'

    def work(conn: Any) -> None:
        conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            topic_id, last = conn.execute(
                text(f"SELECT id, last_seq FROM {s}.topics WHERE name = :name FOR UPDATE"), {"name": name}
            ).one()
            keep = last - count
            conn.execute(
                text(f"DELETE FROM {s}.records WHERE topic_id = :id AND seq > :keep"), {"id": topic_id, "keep": keep}
            )
            conn.execute(
                text(
                    f"UPDATE {s}.topics SET last_seq = :keep, sealed = false, last_digest = "
                    f"(SELECT digest FROM {s}.records WHERE topic_id = :id AND seq = :keep) WHERE id = :id"
                ),
                {"id": topic_id, "keep": keep},
            )

    found._run("lose records", work)


def nats_lose_last_records(backend: DurableStreamBackend, name: str, count: int) -> None:
    """The subject rewritten with its messages up to the last ``count`` records (copied with their headers:
    epoch, ordinals and digests), as a stream restored from an older copy; new sequences, which the
    adapter must not trust over the ordinals. This process forgets what it remembered, as a reconnect
    to a restored server would make it."""
    conn = driver(backend)._connection()
    store = conn.topics
    subject = store.subject(name)

    async def rewrite() -> None:
        messages = await conn.js.batch(subject, 1, 100_000)
        last = max(message.ordinal for message in messages if message.is_record)
        kept = [message for message in messages if message.ordinal <= last - count and message.kind != "s"]
        await conn.js.purge(subject)
        previous = 0
        for message in kept:
            headers = {"Ds-O": str(message.ordinal), "Ds-E": message.epoch, "Ds-H": message.digest}
            if message.kind:
                headers["Ds-K"] = message.kind
            previous = await conn.js.publish(subject, message.payload, headers, previous)

    conn.loop.run(rewrite, 30.0)
    store.forget()


def lose_last_records(backend: DurableStreamBackend, name: str, count: int) -> None:
    """Any adapter's store forgets topic ``name``'s last ``count`` records (see ``*_lose_last_records``)."""
    by_adapter: dict[str, Callable[[DurableStreamBackend, str, int], None]] = {
        "memory": memory_lose_last_records,
        "sqlite": sqlite_lose_last_records,
        "redis": redis_lose_last_records,
        "postgres": postgres_lose_last_records,
        "nats": nats_lose_last_records,
    }
    by_adapter[backend._engine.name](backend, name, count)
