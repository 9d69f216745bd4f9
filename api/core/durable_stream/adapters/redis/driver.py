"""The Redis adapter's driver: keys, scripts and replies of one store, on a standalone or cluster deployment."""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from ..._contract import CursorUnavailableError, DurableStreamError, DurableStreamUnavailableError, TopicSealedError
from ..._digest import sha1_chain
from ..._driver import Appended, Batch, ChangeFeed, Position, Refused, StoredRecord, TopicHead, TopicInfo
from ..._options import Options
from .deployment import Cluster, Deployment, PackedAppend, Standalone
from .feed import RedisChangeFeed
from .prefetch import Prefetch
from .scripts import (
    APPEND_SCRIPT,
    DELETE_SCRIPT,
    HEAD_SCRIPT,
    INFO_SCRIPT,
    RETAIN_SCRIPT,
    SEAL_SCRIPT,
    TRIM_SCRIPT,
    Script,
    topic_keys,
)
from .settings import RedisSettings

__all__ = ["RedisDriver", "open_driver"]


_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
_EMPTY_PREFIX = "e:"
_EMPTY_POSITION = re.compile(r"e:[0-9a-f]{1,64}")


def _translate[T](operation: str, call: Callable[[], T]) -> T:
    """Run ``call``; the one place where redis-py's exceptions become contract errors."""
    try:
        return call()
    except DurableStreamError:
        raise
    except Exception as exc:
        raise DurableStreamUnavailableError(f"Redis {operation} failed: {exc}") from exc


class RedisDriver:
    #: A subscription's own re-read without any wake-up, a last resort: the change feed checks the
    #: heads of all watched topics every ``poll_interval`` (URL option) seconds and wakes those that changed.
    reread_interval = 15.0
    #: What the APPEND script computes with ``redis.sha1hex``.
    chain = staticmethod(sha1_chain)

    def __init__(self, settings: RedisSettings) -> None:
        self._settings = settings
        self._prefix = settings.key_prefix
        self._max_records = settings.max_records
        self._max_age_ms = settings.max_age_ms
        self._sweep_interval = settings.poll_interval
        self.reread_interval = max(RedisDriver.reread_interval, 10 * settings.poll_interval)
        self.identity = f"redis:{settings.key_prefix}"
        self._hint_limit = settings.hint_payload_limit
        #: ``WAIT`` after each append and seal: (replicas, timeout in ms), or None.
        self._wait = (settings.wait_replicas, settings.wait_timeout_ms) if settings.wait_replicas else None
        max_age = settings.max_age_seconds
        # Prefetched records older than this are not handed out: with max_age_seconds the topic may
        # have expired meanwhile. Without it they stay exact however old (a chain of stream IDs proves
        # them), and a short limit would only turn a lagging reader's hits into reads from Redis.
        max_age_hint = 60.0 if max_age is None else min(1.0, max_age / 4)
        # The feed's periodic check renews a mirrored head every poll_interval; an older one is not used.
        # With key TTLs a topic can expire without a hint, so a mirror is trusted no longer than a record.
        sweep = settings.poll_interval
        mirror_age = 3 * sweep if max_age is None else min(3 * sweep, max_age_hint)
        self._prefetch = Prefetch(max_age=max_age_hint, mirror_age=mirror_age) if settings.prefetch else None
        self._name = f"durable-stream-{secrets.token_hex(3)}"
        self._feed_lock = threading.Lock()
        self._feeds: list[RedisChangeFeed] = []
        self._redis: Deployment = _translate("connect", self._open_deployment)
        self._standalone = self._redis if isinstance(self._redis, Standalone) else None
        self._packed_append = PackedAppend(self._keys, self._max_records, self._max_age_ms)
        try:
            _translate("connect", self._redis.ping)
        except BaseException:
            self.close()
            raise

    def _open_deployment(self) -> Deployment:
        settings = self._settings
        common = settings.client_options()
        reads, writes = settings.read_connections, settings.max_connections
        if settings.cluster:
            return Cluster(urllib.parse.urlsplit(settings.url), common, reads, writes, self._name)
        return Standalone(settings.url, common, reads, writes, self._name, sentinel=settings.sentinel)

    # -- keys -------------------------------------------------------------------------------

    def _keys(self, topic: str) -> tuple[bytes, bytes, bytes]:
        return topic_keys(self._prefix, topic)

    def _channel(self, topic: str) -> bytes:
        return self._keys(topic)[2]

    def _eval(self, operation: str, script: Script, topic: str, args: Sequence[Any], *, read: bool = False) -> Any:
        keys = self._keys(topic)
        return _translate(operation, lambda: self._redis.evalsha(script, keys, args, read=read))

    # -- Driver -----------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes, expect: Position | None = None) -> Appended | Refused:
        hint = len(payload) <= self._hint_limit
        epoch = _new_epoch()
        standalone, packed = self._standalone, self._packed_append
        if standalone is not None:
            command = packed.command(topic, payload, epoch.encode(), hint, expect)
            if self._wait is not None:
                wait = self._wait
                reply, acknowledged = _translate(
                    "append", lambda: standalone.evalsha_waiting(APPEND_SCRIPT, command, (), (), wait)
                )
                if reply[0] == 1:
                    self._check_replicas("append", topic, acknowledged)
            else:
                reply = _translate("append", lambda: standalone.evalsha_packed(APPEND_SCRIPT, command))
        else:
            condition = ("", "") if expect is None else (str(expect.ordinal), expect.digest)
            args = (payload, epoch, self._max_records, self._max_age_ms, "1" if hint else "0", *condition)
            reply = self._eval("append", APPEND_SCRIPT, topic, args)
        if reply[0] == 0:
            raise TopicSealedError(f"topic {topic!r} is sealed")
        if reply[0] == 2:
            return Refused(_parse_head(reply[1:]))
        _, epoch_bytes, ordinal, native, first, previous, digest_bytes = reply
        epoch, digest = epoch_bytes.decode(), digest_bytes.decode()
        if self._prefetch is not None:
            self._prefetch.put(
                topic, epoch, int(ordinal), native.decode(), previous.decode(), int(first), payload, digest
            )
        return Appended(epoch, int(ordinal), digest)

    def _check_replicas(self, operation: str, topic: str, acknowledged: int) -> None:
        assert self._wait is not None
        wanted, timeout = self._wait
        if acknowledged < wanted:
            raise DurableStreamUnavailableError(
                f"Redis {operation} on {topic!r} was stored by the primary but acknowledged by {acknowledged} of "
                f"{wanted} replicas within {timeout} ms (wait_replicas): a failover now could lose it"
            )

    def seal(self, topic: str) -> None:
        standalone, wait = self._standalone, self._wait
        if standalone is not None and wait is not None:
            keys, args = self._keys(topic), (_new_epoch(), self._max_age_ms)
            _, acknowledged = _translate(
                "seal", lambda: standalone.evalsha_waiting(SEAL_SCRIPT, None, keys, args, wait)
            )
            self._check_replicas("seal", topic, acknowledged)
            if self._prefetch is not None:
                self._prefetch.invalidate(topic)
            return
        self._eval("seal", SEAL_SCRIPT, topic, (_new_epoch(), self._max_age_ms))
        if self._prefetch is not None:
            self._prefetch.invalidate(topic)  # its hint follows; until then nobody trusts the old head

    def head(self, topic: str, *, create: bool) -> TopicHead | None:
        reply = self._eval("head", HEAD_SCRIPT, topic, ("1" if create else "0", _new_epoch(), self._max_age_ms))
        return _parse_head(reply)

    def read(self, topic: str, after: Position, limit: int) -> Batch:
        if self._prefetch is not None:
            prefetched = self._prefetch.lookup(topic, after, limit)
            if prefetched is not None:
                return prefetched
        if after.native and not _STREAM_ID.fullmatch(after.native):
            if not _EMPTY_POSITION.fullmatch(after.native):
                raise CursorUnavailableError("malformed cursor position", reason="malformed")
            after = Position(after.ordinal)  # before the first record: read from the start
        keys = self._keys(topic)
        stamp = None if self._prefetch is None else self._prefetch.stamp(topic)
        reply = _translate("read", lambda: self._redis.read(keys, after, limit))
        head = _parse_head(reply)
        if head is None:
            return Batch(head=None, records=())
        if stamp is not None and self._prefetch is not None:
            self._prefetch.observe(topic, stamp, head)
        return Batch(head=head, records=[_parse_record(entry) for entry in reply[6]])

    def _heads(self, topics: list[str]) -> list[TopicHead | None]:
        """The heads of many topics at once, for the change feed's periodic check."""
        keys = [self._keys(topic)[:2] for topic in topics]
        replies = _translate("head check", lambda: self._redis.heads(keys))
        heads: list[TopicHead | None] = []
        for (epoch, last, last_native, sealed, digest), length in replies:
            if epoch is None:
                heads.append(None)
                continue
            ordinal = int(last or 0)
            heads.append(
                _parse_head([epoch, ordinal - int(length) + 1, ordinal, sealed, last_native or b"", digest or b""])
            )
        return heads

    def topic_info(self, topic: str) -> TopicInfo | None:
        reply = self._eval("topic info", INFO_SCRIPT, topic, ())
        if not reply:
            return None
        length, first, last, sealed, epoch, digest = reply
        return TopicInfo(topic, int(length), int(first), int(last), bool(sealed), epoch.decode(), digest.decode())

    def trim(self, topic: str, keep_last: int) -> int:
        removed, first = self._eval("trim", TRIM_SCRIPT, topic, (keep_last,))
        if self._prefetch is not None and removed:
            self._prefetch.trimmed(topic, int(first))
        return int(removed)

    def delete(self, topic: str) -> bool:
        existed = self._eval("delete", DELETE_SCRIPT, topic, ())
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
                count, _ = self._redis.evalsha(RETAIN_SCRIPT, (meta, base + b"s", base + b"n"), args)
                removed += int(count)

        _translate("retention", trim_all)
        if removed and self._prefetch is not None:
            self._prefetch.clear()  # which topics lost records is not worth a reverse lookup here
        return removed

    def open_change_feed(self, notify: Callable[[str], None]) -> ChangeFeed | None:
        redis = self._redis
        name = f"{self._name}:feed"
        feed = RedisChangeFeed(
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
    epoch, first, last, sealed, last_native, last_digest = reply[:6]
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
        last_digest=last_digest.decode(),
    )


def _parse_record(entry: Any) -> StoredRecord:
    native, fields = entry
    if len(fields) == 6 and fields[0] == b"o" and fields[2] == b"p" and fields[4] == b"h":
        return StoredRecord(int(fields[1]), native.decode(), fields[3], fields[5].decode())
    values = dict(zip(fields[::2], fields[1::2], strict=True))
    return StoredRecord(int(values[b"o"]), native.decode(), values[b"p"], values.get(b"h", b"").decode())


def _glob_escape(text: bytes) -> bytes:
    return re.sub(rb"([\\*?\[\]])", rb"\\\1", text)


def open_driver(url: str, options: Options) -> RedisDriver:
    return RedisDriver(RedisSettings.from_url(url, options))
