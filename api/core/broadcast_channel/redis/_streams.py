"""Broadcast over a capped, expiring Redis stream: ``XADD`` + ``EXPIRE`` to publish, ``XREAD`` to receive.

Capability card:

- **Delivery**: live-only, at-most-once. A subscription reads the entries added after the stream's
  last ID at the moment it was entered, so nothing published before is replayed and nothing
  published after ``__enter__`` returns is missed while the subscription keeps up. The stream is
  only a short buffer, not a log: it is trimmed to about ``stream_maxlen`` entries (``MAXLEN ~``)
  and deleted ``stream_ttl_seconds`` after the last publish, so a reader that falls further behind
  than that loses the oldest payloads without being told.
- **Ordering**: one total order per topic (the stream's), so payloads from one producer arrive in
  publish order and every subscription sees the same interleaving.
- **Disconnect**: a subscription never reconnects on its own. When its connection breaks,
  ``receive`` raises ``BroadcastChannelUnavailableError`` and the subscription is closed; the
  caller re-subscribes, which starts after the stream's new last ID. ``publish`` retries as the
  caller's client is configured to, then raises the same error.
- **Cost**: every open subscription holds one connection from the client's pool with an
  ``XREAD BLOCK 5000`` in flight on it, polled by the thread calling ``receive`` in 50 ms slices;
  closing a subscription while that read is pending disconnects the connection. Each publish is
  one ``MULTI``/``EXEC`` round trip.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from .._channel import Topic
from ._common import (
    NoRetryLease,
    PollingSubscription,
    RedisTopic,
    check_client,
    redis_errors_translated,
    topic_key,
)

if TYPE_CHECKING:
    from redis import Redis

__all__ = ["RedisStreamsChannel", "StreamSubscription"]

# The entry field holding the payload.
PAYLOAD_FIELD: Final = b"data"

# Entries fetched per XREAD; they are buffered in the subscription and handed out one by one.
_READ_BATCH: Final = 100

# How long one XREAD may stay blocked on the server; it only bounds idle round trips, since the
# socket is polled in short slices meanwhile.
_BLOCK_MS: Final = 5000


class RedisStreamsChannel:
    """Topics are Redis streams at keys named ``key_prefix + name``."""

    def __init__(self, client: Redis, *, key_prefix: str = "", maxlen: int = 1000, ttl_seconds: int = 600) -> None:
        check_client(client)
        if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
            raise ValueError(f"stream_maxlen must be a positive int, not {maxlen!r}")
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 1:
            raise ValueError(f"stream_ttl_seconds must be a positive int, not {ttl_seconds!r}")
        self._client = client
        self._key_prefix = key_prefix
        self._maxlen = maxlen
        self._ttl_seconds = ttl_seconds

    def topic(self, name: str) -> Topic:
        key = topic_key(self._key_prefix, name)
        return RedisTopic(
            f"stream {key!r}",
            functools.partial(self._publish, key),
            functools.partial(StreamSubscription, self._client, key),
        )

    def _publish(self, key: str, payload: bytes) -> None:
        with redis_errors_translated(f"XADD to {key!r}"):
            # One transaction, so a stream is never left without its expiry (and never outlives
            # its last publish by more than the TTL).
            pipe = self._client.pipeline(transaction=True)
            pipe.xadd(key, {PAYLOAD_FIELD: payload}, maxlen=self._maxlen, approximate=True)
            pipe.expire(key, self._ttl_seconds)
            pipe.execute()


def _entries(response: Any) -> Iterator[tuple[bytes, dict[Any, Any]]]:
    """Yield ``(entry_id, fields)`` from an XREAD reply.

    RESP2 replies are ``[[key, entries]]`` and RESP3 replies ``{key: [entries]}`` after redis-py's
    parsing; an entry is the only 2-item sequence whose second item is a dict.
    """
    if isinstance(response, dict):
        response = list(response.values())
    if not isinstance(response, list | tuple):
        return
    if len(response) == 2 and isinstance(response[0], bytes) and isinstance(response[1], dict):
        yield response[0], response[1]
        return
    for item in response:
        yield from _entries(item)


class _StreamReader:
    """The connection side of a stream subscription; it never refers back to the subscription.

    Redis times out a blocked ``XREAD`` only on its ``hz`` tick (every 100 ms by default), so short
    ``BLOCK`` values cannot give the 50 ms slices the subscription needs. Instead one long
    ``XREAD BLOCK`` stays in flight and the socket is polled for its reply in short slices. A reply
    still owed when the subscription closes makes the connection unusable for anyone else, so it is
    then disconnected before it goes back to the pool.
    """

    def __init__(self, client: Redis, key: str) -> None:
        self._client = client
        self._key = key
        self._reader: Any = None
        self._lease = NoRetryLease()
        self._last_id = b"0-0"
        self._in_flight = False
        self._buffer: collections.deque[bytes] = collections.deque()

    def open(self) -> None:
        # A client pinned to one pooled connection, so retries can be switched off for this
        # subscription alone (see NoRetryLease) and XREAD can be left in flight on it.
        client: Any = self._client  # redis-py leaves Redis.client() untyped
        self._reader = client.client()
        self._lease.apply(self._reader.connection)
        self._last_id = self._current_last_id()

    def _current_last_id(self) -> bytes:
        # XREAD from "$" would start at whatever is last when each XREAD *arrives*, losing entries
        # added between two reads or between __enter__ and the first read; a fixed ID loses none.
        import redis

        attempts = 3
        for attempt in range(attempts):
            try:
                info = self._reader.xinfo_stream(self._key)
            except redis.ResponseError:
                if not self._reader.exists(self._key):
                    # Everything a future XADD creates was published after this point.
                    return b"0-0"
                # The key appeared between the two calls, or it is not a stream at all.
                if attempt == attempts - 1:
                    raise
                continue
            last_id = info["last-generated-id"]
            return last_id if isinstance(last_id, bytes) else str(last_id).encode()
        raise AssertionError("unreachable")

    def poll(self, timeout: float) -> bytes | None:
        if self._buffer:
            return self._buffer.popleft()
        connection = self._reader.connection
        if not self._in_flight:
            connection.send_command(
                "XREAD", "COUNT", _READ_BATCH, "BLOCK", _BLOCK_MS, "STREAMS", self._key, self._last_id
            )
            self._in_flight = True
        if not connection.can_read(timeout=timeout):
            return None
        response = self._reader.parse_response(connection, "XREAD")
        self._in_flight = False
        for entry_id, fields in _entries(response):
            self._last_id = entry_id
            payload = fields.get(PAYLOAD_FIELD)
            if isinstance(payload, bytes):
                self._buffer.append(payload)
        return self._buffer.popleft() if self._buffer else None

    def release(self) -> None:
        reader, self._reader = self._reader, None
        if reader is None:
            return
        with contextlib.suppress(Exception):
            if self._in_flight:
                reader.connection.disconnect()
        # Restore first: closing the single-connection client hands its connection back to the pool.
        self._lease.restore()
        with contextlib.suppress(Exception):
            reader.close()


class StreamSubscription(PollingSubscription):
    """Reads one stream from the last ID it had when the subscription was entered."""

    def __init__(self, client: Redis, key: str) -> None:
        super().__init__(f"subscription to stream {key!r}")
        self._stream = _StreamReader(client, key)

    def _open(self) -> None:
        self._own(self._stream.release)
        self._stream.open()

    def _poll(self, timeout: float) -> bytes | None:
        return self._stream.poll(timeout)
