"""The Redis change feed's links: one dedicated connection per node, and the hints read from them.

:class:`LinkReader` holds the connections (:class:`FeedLink`), keeps their sharded subscriptions in
line with the watched topics, reads and interprets their replies, checks their health and replaces
broken ones. It does not decide who reads: :class:`~.feed.RedisChangeFeed` (its subclass) runs the
listener thread and hands the links to a waiting subscription and back (the "baton"). Everything
about the links is touched only by whoever holds the baton.
"""

from __future__ import annotations

import collections
import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .prefetch import Prefetch, apply_hint

__all__ = ["HEALTH_INTERVAL", "RECONNECT_DELAYS", "FeedLink", "LinkReader"]

#: An idle link is pinged this often; no answer within the same time means it is dead.
HEALTH_INTERVAL = 5.0
RECONNECT_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0)


class FeedLink:
    """One dedicated connection to one Redis node, used only by the holder of the feed's baton."""

    def __init__(self, address: str, connection: Any) -> None:
        self.address = address
        self.connection = connection
        self.channels: dict[bytes, str] = {}  # subscribed (or requested) channel -> topic
        self.confirmed: set[bytes] = set()  # channels whose subscription the server confirmed
        self.outstanding: collections.deque[tuple[str, bytes]] = collections.deque()
        self.last_io = time.monotonic()
        self.ping_sent: float | None = None

    def socket(self) -> Any:
        return getattr(self.connection, "_sock", None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.disconnect()


class LinkReader:
    """The links of one change feed and what is read from them; see the module docstring."""

    def __init__(
        self,
        *,
        notify: Callable[[str], None],
        prefetch: Prefetch,
        address_of: Callable[[bytes], str],
        connect: Callable[[str], Any],
        refresh_topology: Callable[[], None],
    ) -> None:
        self._notify = notify
        self._prefetch = prefetch
        self._address_of = address_of
        self._connect = connect
        self._refresh_topology = refresh_topology
        self._lock = threading.Lock()
        self._watched: dict[str, bytes] = {}
        self._dirty: set[str] = set()  # topics whose subscription must be (re)checked
        self._links: dict[str, FeedLink] = {}
        self._placed: dict[str, tuple[str, bytes]] = {}  # topic -> (node address, channel) subscribed
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._refresh_due = False

    def link_count(self) -> int:
        return len(self._links)

    def subscribed_topics(self) -> set[str]:
        """Topics whose hints currently arrive (the server confirmed the subscription)."""
        topics = (
            link.channels.get(channel)  # read without the baton: a channel may go meanwhile
            for link in list(self._links.values())
            for channel in list(link.confirmed)
        )
        return {topic for topic in topics if topic is not None}

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _wait(self, timeout: float) -> list[Any]:
        sockets = [sock for link in self._links.values() if (sock := link.socket()) is not None]
        try:
            readable, _, _ = select.select([self._wake_r, *sockets], [], [], timeout)
        except (OSError, ValueError):  # a socket closed under us: the drain below notices
            return []
        if self._wake_r in readable:
            with contextlib.suppress(OSError):
                while self._wake_r.recv(4096):
                    pass
        return list(readable)

    def _sync(self) -> None:
        """Bring every link's subscriptions in line with the watched topics."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            watched = {topic: self._watched.get(topic) for topic in dirty}
        now = time.monotonic()
        retry: list[str] = []
        for topic, channel in watched.items():
            address: str | None = None
            if channel is not None:
                try:
                    address = self._address_of(channel)
                except Exception:  # topology unknown right now: try again shortly
                    retry.append(topic)
                    continue
            placed = self._placed.get(topic)
            if placed is not None and placed != (address, channel):
                del self._placed[topic]
                self._prefetch.live(topic, False)
                old = self._links.get(placed[0])
                if old is not None and old.channels.pop(placed[1], None) is not None:
                    self._send(old, "unsub", placed[1])
                placed = None
            if channel is None or address is None or placed is not None:
                continue
            link = self._links.get(address)
            if link is None:
                link = self._open(address, now)
                if link is None:
                    retry.append(topic)
                    continue
            link.channels[channel] = topic
            self._placed[topic] = (address, channel)
            self._send(link, "sub", channel)
        if retry:
            self._mark_dirty(retry)

    def _open(self, address: str, now: float) -> FeedLink | None:
        if self._retry_at.get(address, 0.0) > now:
            return None
        try:
            connection = self._connect(address)
            connection.connect()
        except Exception:
            failures = self._failures.get(address, 0)
            self._failures[address] = failures + 1
            self._retry_at[address] = now + RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
            return None
        self._retry_at.pop(address, None)
        self._failures.pop(address, None)
        link = FeedLink(address, connection)
        self._links[address] = link
        return link

    def _send(self, link: FeedLink, kind: str, channel: bytes) -> None:
        command = {"sub": "SSUBSCRIBE", "unsub": "SUNSUBSCRIBE", "ping": "PING"}[kind]
        try:
            if kind == "ping":
                link.connection.send_command(command)
            else:
                link.connection.send_command(command, channel)
        except Exception:
            self._fail(link)
            return
        link.outstanding.append((kind, channel))

    def _drain(self, link: FeedLink, readable: bool) -> None:
        if link.socket() is None:
            # Disconnected by redis-py: a read was interrupted (KeyboardInterrupt in a subscription
            # reading the links). Its next call would reconnect silently, without the subscriptions.
            self._fail(link)
            return
        # A socket select() reported readable is read at once: the extra non-blocking probe would
        # only add system calls before the hint reaches its waiters.
        try:
            while self._links.get(link.address) is link and (readable or link.connection.can_read(timeout=0)):
                readable = False
                try:
                    reply = link.connection.read_response()
                except Exception as exc:
                    if not _is_reply_error(exc):
                        raise
                    self._on_error_reply(link)
                    continue
                link.last_io = time.monotonic()
                link.ping_sent = None
                self._on_reply(link, reply)
        except Exception:
            self._fail(link)

    def _on_reply(self, link: FeedLink, reply: Any) -> None:
        if not isinstance(reply, list) or not reply:
            if reply in (b"PONG", "PONG"):  # PING before the first subscription
                self._pop_outstanding(link, "ping")
            return
        kind = reply[0]
        if kind == b"smessage" and len(reply) == 3:
            topic = link.channels.get(reply[1])
            if topic is not None:
                self.deliver_hint(topic, reply[2])
        elif kind == b"ssubscribe":
            self._pop_outstanding(link, "sub")
            topic = link.channels.get(reply[1])
            if topic is not None:
                link.confirmed.add(reply[1])
                self._prefetch.live(topic, True)
                # Subscribed only now: a record appended since the subscription's last read sent its
                # hint to nobody, so make the subscription read once more.
                self._notify_safely([topic])
        elif kind == b"sunsubscribe":
            link.confirmed.discard(reply[1])
            if link.outstanding and link.outstanding[0] == ("unsub", reply[1]):
                link.outstanding.popleft()
                return
            # Not asked for: the slot moved to another node. Find its new home.
            topic = link.channels.pop(reply[1], None)
            if topic is not None:
                self._placed.pop(topic, None)
                self._prefetch.live(topic, False)
                self._topology_changed([topic])
        elif kind == b"pong":
            self._pop_outstanding(link, "ping")

    def _pop_outstanding(self, link: FeedLink, kind: str) -> None:
        if link.outstanding and link.outstanding[0][0] == kind:
            link.outstanding.popleft()

    def _on_error_reply(self, link: FeedLink) -> None:
        """A command was refused (``MOVED`` while slots migrate): re-route its topic."""
        if not link.outstanding:
            return
        kind, channel = link.outstanding.popleft()
        topic = link.channels.pop(channel, None) if kind == "sub" else None
        if topic is not None:
            self._placed.pop(topic, None)
            self._prefetch.live(topic, False)
            self._topology_changed([topic])

    def deliver_hint(self, topic: str, message: bytes) -> None:
        """Take one hint message read for ``topic`` into the prefetch and wake the topic's waiters."""
        apply_hint(self._prefetch, topic, message)
        self._notify_safely([topic])

    def _check_health(self) -> None:
        now = time.monotonic()
        for link in list(self._links.values()):
            if link.ping_sent is not None:
                if now - link.ping_sent > HEALTH_INTERVAL:
                    self._fail(link)
            elif now - link.last_io > HEALTH_INTERVAL:
                link.ping_sent = now
                self._send(link, "ping", b"")

    def _fail(self, link: FeedLink) -> None:
        """A link broke: every topic it served may have missed hints, so all of them re-read."""
        if self._links.get(link.address) is not link:
            return
        del self._links[link.address]
        link.close()
        topics = list(link.channels.values())
        for topic in topics:
            self._placed.pop(topic, None)
            self._prefetch.live(topic, False)
        self._retry_at[link.address] = time.monotonic() + RECONNECT_DELAYS[0]
        self._mark_dirty(topics)
        # The listener refreshes the topology (it may wait on unreachable nodes): not a
        # subscription that happens to be reading, and only after the waiters were woken.
        self._refresh_due = True
        self._notify_safely(topics)

    def _topology_changed(self, topics: list[str]) -> None:
        self._refresh_due = True  # before the topics are placed again (see _listen)
        self._mark_dirty(topics)
        self._notify_safely(topics)

    def _mark_dirty(self, topics: list[str]) -> None:
        with self._lock:
            self._dirty.update(topic for topic in topics if topic in self._watched)

    def _notify_safely(self, topics: list[str]) -> None:
        for topic in topics:
            with contextlib.suppress(Exception):  # a waiter's bug must not stop the shared reader
                self._notify(topic)


def _is_reply_error(exc: Exception) -> bool:
    from redis.exceptions import ResponseError

    return isinstance(exc, ResponseError)
