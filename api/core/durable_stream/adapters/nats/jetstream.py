"""The JetStream protocol the adapter speaks, on the adapter's event loop (asyncio, nats-py).

Only a handful of requests are used, all of them without JetStream consumers:

- a compare-and-set publish (``Nats-Expected-Last-Subject-Sequence``) for every append, seal and
  marker;
- direct gets (``$JS.API.DIRECT.GET``): the last message of a subject (``last_by_subj``), its first
  message from a sequence (``next_by_subj``; from sequence 1, its first retained) and batches of the
  next messages of a subject from a sequence (``batch``, NATS Server ≥ 2.11), answered by any replica;
- a purge of one subject (``filter``, optionally ``keep``) for trims and deletes, followed by a
  notice on the topic's republish subject.

The stream itself republishes every stored message (its ``republish`` setting). The messages'
headers are described in :mod:`.messages`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import urllib.parse
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from ..._contract import DurableStreamUnavailableError
from .messages import KIND_PURGED, LIVE_PREFIX, StreamMessage, parse_message
from .settings import NatsSettings

__all__ = ["MIN_SERVER_VERSION", "JetStream", "WrongSequenceError", "acknowledged_sequence"]

#: The oldest server the adapter accepts (see the capability card: batched direct gets, and the
#: concurrent compare-and-set test).
MIN_SERVER_VERSION = (2, 11, 0)

#: A compare-and-set that lost: checked against the stored last sequence (10071), or in a cluster
#: against a publish the leader has proposed but not applied yet (10164).
_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
#: The status a batch read in flight is ended with when the connection drops.
_DISCONNECTED = "disconnected"
_STREAM_NOT_FOUND = 10059


class WrongSequenceError(Exception):
    """A compare-and-set publish lost: the subject's last sequence was not the expected one."""


def acknowledged_sequence(reply: dict[str, Any]) -> int | None:
    """The stream sequence a publish acknowledgement gives, or ``None`` if the stream does not exist.

    Raises:
        WrongSequenceError: The compare-and-set lost; nothing was stored.
        DurableStreamUnavailableError: JetStream refused the publish for another reason.
    """
    error = reply.get("error")
    if error is None:
        return int(reply["seq"])
    if error.get("err_code") in _WRONG_LAST_SEQUENCE:
        raise WrongSequenceError(error.get("description", "wrong last sequence"))
    if error.get("err_code") == _STREAM_NOT_FOUND:
        return None
    raise DurableStreamUnavailableError(
        f"JetStream refused the publish: {error.get('description')} (error {error.get('err_code')})"
    )


class _Client(Client):
    """nats-py's client with a header parser that costs less per message.

    A batch of direct gets is one message per record, each with eight or so headers; nats-py's
    parser checks every character of every header name with a generator and took most of a batch
    read's time. This one accepts and returns the same for well-formed headers (names are ASCII
    tokens without whitespace), and skips malformed lines as nats-py does.
    """

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in raw.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            key = name.strip()
            if not key.isascii() or len(key.split()) != 1:
                continue
            out[key.decode("ascii")] = value.strip().decode("utf-8", "replace")
        return out


def _status(msg: Msg) -> str | None:
    headers = msg.headers
    if headers and not msg.data:
        return headers.get("Status")
    return None


class JetStream:
    """One NATS connection of one backend object, and the stream's requests. Loop-side only."""

    def __init__(self, settings: NatsSettings, on_connection_change: Callable[[bool], None]) -> None:
        self._settings = settings
        self._stream = settings.stream
        self._timeout = settings.request_timeout
        self._replicated = settings.replicas > 1
        self._on_connection_change = on_connection_change
        self.nc: Client | None = None
        self._inbox = ""
        self._batches: dict[str, asyncio.Queue[Msg]] = {}
        self._batch_counter = 0
        self._inflight: set[asyncio.Task[Any]] = set()
        self.server_version = ""

    # -- connection ---------------------------------------------------------------------------

    async def connect(self) -> None:
        settings = self._settings
        options: dict[str, Any] = {
            "servers": list(settings.servers),
            "name": settings.name,
            "connect_timeout": settings.connect_timeout,
            # Reconnect for ever in the background: the same backend object works again when the
            # server is back. Publishes are never buffered while disconnected (see _guard()).
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.25,
            "ping_interval": 5,
            "max_outstanding_pings": 2,
            "disconnected_cb": self._disconnected,
            "reconnected_cb": self._reconnected,
            "error_cb": self._error,
            "closed_cb": self._disconnected,
            "inbox_prefix": "_INBOX",
        }
        for name in ("user", "password", "token"):
            value = getattr(settings, name)
            if value is not None:
                options[name] = value
        if settings.creds is not None:
            options["user_credentials"] = settings.creds
        if settings.nkeys_seed is not None:
            options["nkeys_seed"] = settings.nkeys_seed
        if settings.tls:
            context = ssl.create_default_context(cafile=settings.tls_ca)
            if settings.tls_cert is not None:
                context.load_cert_chain(settings.tls_cert, settings.tls_key)
            options["tls"] = context
            if settings.tls_hostname is not None:
                options["tls_hostname"] = settings.tls_hostname
        # The first connect must not retry for ever: an unreachable server fails connect().
        nc = await self._first_connect(options)
        self.nc = nc
        version = nc.connected_server_version
        self.server_version = str(version)
        found = (version.major, version.minor, version.patch)
        if found < MIN_SERVER_VERSION:
            await nc.close()
            minimum = ".".join(map(str, MIN_SERVER_VERSION))
            raise DurableStreamUnavailableError(
                f"NATS server {version} is too old for the durable-stream adapter (at least {minimum} is needed)"
            )
        if nc.max_payload <= 0 or not getattr(nc, "_server_info", {}).get("jetstream", False):
            await nc.close()
            raise DurableStreamUnavailableError("the NATS server does not have JetStream enabled")
        self._inbox = nc.new_inbox()
        await nc.subscribe(f"{self._inbox}.*", cb=self._route)

    async def _first_connect(self, options: dict[str, Any]) -> Client:
        nc = _Client()
        errors: list[BaseException] = []

        async def first_error(exc: Exception) -> None:
            errors.append(exc)

        try:
            # Each server is tried at most twice: an unreachable deployment fails connect().
            await nc.connect(**{**options, "max_reconnect_attempts": 1, "error_cb": first_error})
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            raise DurableStreamUnavailableError(f"cannot connect to NATS at {self._redacted()}: {exc!r}") from exc
        # Connected: from now on reconnect for ever.
        nc.options["max_reconnect_attempts"] = -1
        nc.options["error_cb"] = self._error
        return nc

    def _redacted(self) -> str:
        return ",".join(server.rpartition("@")[2] for server in self._settings.servers)

    async def _disconnected(self) -> None:
        if self.nc is None:
            return  # closed by close(): nothing was lost
        for task in list(self._inflight):
            task.cancel()
        for queue in self._batches.values():
            queue.put_nowait(Msg(_client=None, data=b"", headers={"Status": _DISCONNECTED}))  # type: ignore[arg-type]
        self._on_connection_change(False)

    async def _reconnected(self) -> None:
        self._on_connection_change(True)

    async def _error(self, exc: Exception) -> None:
        pass  # reported by the operations that fail; nothing to do here

    @property
    def stream(self) -> str:
        return self._stream

    def server(self) -> urllib.parse.ParseResult | None:
        """The URL of the server the connection is on (any thread), or ``None`` while it is down."""
        nc = self.nc
        if nc is None or not nc.is_connected:
            return None
        url: urllib.parse.ParseResult | None = nc.connected_url
        return url

    @property
    def replicated(self) -> bool:
        """Whether the stream has replicas (direct gets may then come from a follower behind the leader)."""
        return self._replicated

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def _client(self) -> Client:
        nc = self.nc
        if nc is None or not nc.is_connected:
            raise DurableStreamUnavailableError("not connected to NATS (reconnecting)")
        return nc

    async def close(self) -> None:
        # Let the operations in flight finish first (a subscription's read racing the backend's
        # close); closing the connection under them would fail them with an outage.
        inflight = [task for task in self._inflight if task is not asyncio.current_task()]
        if inflight:
            await asyncio.wait(inflight, timeout=1.0)
        nc, self.nc = self.nc, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=2.0)

    # -- the stream ----------------------------------------------------------------------------

    def stream_config(self) -> dict[str, Any]:
        settings = self._settings
        config: dict[str, Any] = {
            "name": self._stream,
            "subjects": [f"{settings.subject_prefix}.>"],
            "retention": "limits",
            "storage": settings.storage,
            "num_replicas": settings.replicas,
            "max_msgs_per_subject": settings.max_records or -1,
            "max_age": int((settings.max_age_seconds or 0) * 1e9),
            "discard": "old",
            "allow_direct": True,
            "deny_delete": True,
            "allow_rollup_hdrs": False,
            # Stored messages, pushed to the change feed without a consumer (see prefetch.py).
            "republish": {"src": f"{settings.subject_prefix}.>", "dest": f"{LIVE_PREFIX}.{self._stream}.>"},
        }
        return config

    def live_subject(self, token: str) -> str:
        """The core NATS subject on which the stream republishes the topic's stored messages."""
        return f"{LIVE_PREFIX}.{self._stream}.{token}"

    async def ensure_stream(self) -> None:
        """Create the stream with the configured options, or check that the existing one matches."""
        wanted = self.stream_config()
        reply = await self._api(f"STREAM.INFO.{self._stream}", b"")
        error = reply.get("error")
        if error is not None and error.get("err_code") == _STREAM_NOT_FOUND:
            reply = await self._api(f"STREAM.CREATE.{self._stream}", json.dumps(wanted).encode())
            error = reply.get("error")
            if error is None:
                return
            created_error = error
            reply = await self._api(f"STREAM.INFO.{self._stream}", b"")  # created meanwhile by another process?
            error = reply.get("error") and created_error
        if error is not None:
            raise DurableStreamUnavailableError(f"JetStream stream {self._stream!r}: {error.get('description')}")
        existing = reply["config"]
        different = [
            f"{key}={existing.get(key)!r} (wanted {value!r})"
            for key, value in wanted.items()
            if key not in ("name", "deny_delete", "allow_rollup_hdrs", "republish")
            and existing.get(key, _absent(key)) != value
        ]
        if different:
            raise ValueError(
                f"JetStream stream {self._stream!r} exists with other settings: {', '.join(different)}; "
                "connect with the same options, another 'stream', or update the stream"
            )
        republish = existing.get("republish") or {}
        if {key: republish.get(key) for key in ("src", "dest")} != wanted["republish"] or republish.get("headers_only"):
            # A stream created before the adapter republished: add it (an allowed update).
            reply = await self._api(f"STREAM.UPDATE.{self._stream}", json.dumps({**existing, **wanted}).encode())
            error = reply.get("error")
            if error is not None:
                raise DurableStreamUnavailableError(
                    f"JetStream stream {self._stream!r} cannot republish: {error.get('description')}"
                )

    async def _api(self, suffix: str, payload: bytes) -> dict[str, Any]:
        msg = await self._request(f"$JS.API.{suffix}", payload)
        reply: dict[str, Any] = json.loads(msg.data)
        return reply

    async def _request(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> Msg:
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            return await self._client().request(subject, payload, timeout=self._timeout, headers=headers)
        finally:
            if task is not None:
                self._inflight.discard(task)

    # -- messages ------------------------------------------------------------------------------

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str], expected_last: int) -> int:
        """Publish if the subject's last sequence is ``expected_last`` (0: no message); return the sequence."""
        headers["Nats-Expected-Last-Subject-Sequence"] = str(expected_last)
        headers["Nats-Expected-Stream"] = self._stream
        for attempt in range(2):
            try:
                msg = await self._request(subject, payload, headers)
            except nats.errors.NoRespondersError:
                if attempt:
                    raise
                await self.ensure_stream()  # deleted behind our back: re-create it (a new history)
                continue
            seq = acknowledged_sequence(json.loads(msg.data))
            if seq is not None:
                return seq
            if not attempt:
                await self.ensure_stream()
        raise DurableStreamUnavailableError("JetStream refused the publish: the stream does not exist")

    async def last(self, subject: str) -> StreamMessage | None:
        """The last message of ``subject``, or ``None``."""
        if self._replicated:
            return await self._from_leader({"last_by_subj": subject})
        return await self._direct(f"$JS.API.DIRECT.GET.{self._stream}.{subject}", b"")

    async def first(self, subject: str) -> StreamMessage | None:
        """The first retained message of ``subject``, or ``None``."""
        return await self.next_message(subject, 1)

    async def next_message(self, subject: str, seq: int) -> StreamMessage | None:
        """The first retained message of ``subject`` with a sequence from ``seq`` on, or ``None``."""
        request = {"seq": max(seq, 1), "next_by_subj": subject}
        if self._replicated:
            return await self._from_leader(request)
        return await self._direct(f"$JS.API.DIRECT.GET.{self._stream}", json.dumps(request).encode())

    async def _from_leader(self, request: dict[str, Any]) -> StreamMessage | None:
        """A message get answered by the stream leader: with replicas, a direct get may come from a
        follower that has not applied the newest messages yet, and heads must never go backwards."""
        try:
            reply = await self._api(f"STREAM.MSG.GET.{self._stream}", json.dumps(request).encode())
        except nats.errors.NoRespondersError:
            return None
        error = reply.get("error")
        if error is not None:
            if error.get("code") == 404:
                return None
            raise DurableStreamUnavailableError(f"JetStream message get failed: {error.get('description')}")
        message = reply["message"]
        raw = base64.b64decode(message.get("hdrs") or b"")
        headers = _Client._parse_header_lines(raw.partition(b"\r\n")[2])
        headers["Nats-Sequence"] = str(message["seq"])
        headers["Nats-Subject"] = message.get("subject", "")
        return parse_message(Msg(_client=None, data=base64.b64decode(message.get("data") or b""), headers=headers))  # type: ignore[arg-type]

    async def _direct(self, subject: str, payload: bytes) -> StreamMessage | None:
        try:
            msg = await self._request(subject, payload)
        except nats.errors.NoRespondersError:
            return None  # no stream (deleted, or lost by a memory-only server): no topic either
        status = _status(msg)
        if status == "404":
            return None
        if status is not None:
            raise DurableStreamUnavailableError(f"JetStream direct get failed: {status} {msg.headers}")
        return parse_message(msg)

    async def batch(self, subject: str, start: int, limit: int) -> list[StreamMessage]:
        """Up to ``limit`` messages of ``subject`` with sequences from ``start`` on, in order."""
        self._batch_counter += 1
        token = str(self._batch_counter)
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._batches[token] = queue
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            request = json.dumps({"seq": max(start, 1), "next_by_subj": subject, "batch": limit}).encode()
            await self._client().publish(f"$JS.API.DIRECT.GET.{self._stream}", request, reply=f"{self._inbox}.{token}")
            found: list[StreamMessage] = []
            async with asyncio.timeout(self._timeout):
                while True:
                    msg = await queue.get()
                    status = _status(msg)
                    if status is None:
                        found.append(parse_message(msg))
                        if len(found) >= limit:
                            return found
                        continue
                    if status in ("204", "404", "503"):  # end of batch / nothing (more) / no stream at all
                        return found
                    if status == _DISCONNECTED:
                        raise DurableStreamUnavailableError("the connection to NATS was lost during a read")
                    raise DurableStreamUnavailableError(f"JetStream batch get failed: {status} {msg.headers}")
        finally:
            self._batches.pop(token, None)
            if task is not None:
                self._inflight.discard(task)

    async def _route(self, msg: Msg) -> None:
        queue = self._batches.get(msg.subject.rpartition(".")[2])
        if queue is not None:
            queue.put_nowait(msg)

    async def purge(self, subject: str, keep: int | None = None) -> int:
        """Purge ``subject`` (all but its last ``keep`` messages); return how many messages went."""
        request: dict[str, Any] = {"filter": subject}
        if keep is not None:
            request["keep"] = keep
        try:
            reply = await self._api(f"STREAM.PURGE.{self._stream}", json.dumps(request).encode())
        except nats.errors.NoRespondersError:
            return 0
        error = reply.get("error")
        if error is not None:
            if error.get("err_code") == _STREAM_NOT_FOUND:
                return 0
            raise DurableStreamUnavailableError(f"JetStream purge failed: {error.get('description')}")
        return int(reply.get("purged", 0))

    async def announce_purge(self, token: str) -> None:
        """Tell other backend objects' change feeds that the topic lost messages (a core NATS message)."""
        with contextlib.suppress(Exception):  # a hint only: their head checks find the purge anyway
            await self._client().publish(self.live_subject(token), b"", headers={"Ds-K": KIND_PURGED})

    async def stream_leader(self) -> str:
        """The server name of the stream's leader (``""`` for a stream without a cluster)."""
        reply = await self._api(f"STREAM.INFO.{self._stream}", b"")
        return str(reply.get("cluster", {}).get("leader", ""))

    async def consumer_count(self) -> int:
        reply = await self._api(f"STREAM.INFO.{self._stream}", b"")
        return int(reply.get("state", {}).get("consumer_count", 0))


def _absent(key: str) -> Any:
    return {"allow_direct": False, "max_age": 0, "max_msgs_per_subject": -1}.get(key)
