"""Settings of the Redis adapter, parsed once from the URL and the connection options."""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..._options import Options

__all__ = ["DEFAULT_KEY_PREFIX", "SSL_OPTIONS", "RedisSettings", "SentinelSettings"]

DEFAULT_KEY_PREFIX = "ds:"
SSL_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")


@dataclasses.dataclass(frozen=True, slots=True)
class SentinelSettings:
    """Where a ``redis+sentinel://`` URL's primary is found: ask these sentinels for ``service``."""

    nodes: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    #: Credentials of the primary (the URL's user information).
    username: str | None = None
    password: str | None = None
    #: Credentials of the sentinels themselves (options ``sentinel_username``, ``sentinel_password``).
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    #: Seconds each question to a sentinel may take (option ``sentinel_socket_timeout``).
    sentinel_socket_timeout: float = 0.5
    #: ``rediss+sentinel://``: the primary is reached over TLS.
    tls: bool = False

    @classmethod
    def from_url(cls, url: str, options: Options) -> SentinelSettings:
        parts = urllib.parse.urlsplit(url)
        nodes = []
        for item in parts.netloc.rpartition("@")[2].split(","):
            host, _, port = item.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError("a redis+sentinel:// URL lists its sentinels as host:port,host:port,…")
            nodes.append((host.strip("[]"), int(port)))
        segments = [segment for segment in parts.path.split("/") if segment]
        if not segments or len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
            raise ValueError("a redis+sentinel:// URL's path is /<service name>[/<db>]")
        return cls(
            nodes=tuple(nodes),
            service=urllib.parse.unquote(segments[0]),
            db=int(segments[1]) if len(segments) == 2 else 0,
            username=urllib.parse.unquote(parts.username) if parts.username else None,
            password=urllib.parse.unquote(parts.password) if parts.password else None,
            sentinel_username=options.pop_str("sentinel_username"),
            sentinel_password=options.pop_str("sentinel_password"),
            sentinel_socket_timeout=options.pop_float("sentinel_socket_timeout", 0.5, minimum=0.001),
            tls=parts.scheme.lower() == "rediss+sentinel",
        )


@dataclasses.dataclass(frozen=True, slots=True)
class RedisSettings:
    #: The URL without its query string.
    url: str
    #: ``redis+cluster://``: the URL lists cluster nodes.
    cluster: bool = False
    #: Prefix of every key (inside the hash tag); never contains ``{`` or ``}``.
    key_prefix: str = DEFAULT_KEY_PREFIX
    #: Exact ``MAXLEN`` per topic (0: unlimited).
    max_records: int = 0
    #: ``max_age_seconds``, or ``None`` when records do not expire.
    max_age_seconds: float | None = None
    #: Connections shared by all subscriptions' reads (per node with Redis Cluster).
    read_connections: int = 3
    #: Connections for appends and other commands (per node with Redis Cluster).
    max_connections: int = 16
    socket_timeout: float = 5.0
    socket_connect_timeout: float = 2.0
    #: Seconds between the change feed's checks of all watched topics' heads.
    poll_interval: float = 1.0
    #: Keep just-appended records (from hints and local appends) for readers at the tail.
    prefetch: bool = True
    #: Largest payload copied into a hint (0: wake-ups only).
    hint_payload_limit: int = 16384
    #: ``ssl_*`` options for ``rediss://`` (passed to redis-py as given).
    ssl: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: ``redis+sentinel://``: the sentinels that name the primary.
    sentinel: SentinelSettings | None = None
    #: Replicas that must acknowledge each append and seal (``WAIT``) before it returns (0: none).
    wait_replicas: int = 0
    #: How long an append waits for them; fewer by then is ``DurableStreamUnavailableError``.
    wait_timeout_ms: int = 1000

    @classmethod
    def from_url(cls, url: str, options: Options) -> RedisSettings:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        prefix = options.pop_str("key_prefix", DEFAULT_KEY_PREFIX)
        if "{" in prefix or "}" in prefix:
            raise ValueError("option 'key_prefix' must not contain '{' or '}'")
        max_records = options.pop_int("max_records", minimum=1)
        sentinel = SentinelSettings.from_url(url, options) if scheme.endswith("+sentinel") else None
        settings = cls(
            url=url,
            cluster=scheme == "redis+cluster",
            sentinel=sentinel,
            key_prefix=prefix,
            max_records=max_records or 0,
            max_age_seconds=options.pop_float("max_age_seconds", minimum=0.001),
            read_connections=options.pop_int("read_connections", 3, minimum=1),
            max_connections=options.pop_int("max_connections", 16, minimum=1),
            socket_timeout=options.pop_float("socket_timeout", 5.0, minimum=0.01),
            socket_connect_timeout=options.pop_float("socket_connect_timeout", 2.0, minimum=0.01),
            poll_interval=options.pop_float("poll_interval", 1.0, minimum=0.01),
            prefetch=options.pop_bool("prefetch", True),
            hint_payload_limit=options.pop_int("hint_payload_limit", 16384, minimum=0),
            ssl={name: value for name in SSL_OPTIONS if (value := options.pop_str(name)) is not None},
            wait_replicas=options.pop_int("wait_replicas", 0, minimum=0) or 0,
            wait_timeout_ms=options.pop_int("wait_timeout_ms", 1000, minimum=1) or 1000,
        )
        if settings.ssl and scheme not in ("rediss", "rediss+sentinel"):
            raise ValueError(f"options {', '.join(sorted(settings.ssl))} need a rediss:// URL")
        if settings.wait_replicas and settings.cluster:
            # WAIT counts the writes of its own connection, which redis-py's cluster client does not pin.
            raise ValueError("option 'wait_replicas' needs one primary (redis://, rediss://, +sentinel), not a cluster")
        return settings

    @property
    def max_age_ms(self) -> int:
        """``max_age_seconds`` in whole milliseconds (at least 1), or 0 without it."""
        return 0 if self.max_age_seconds is None else max(1, round(self.max_age_seconds * 1000))

    def client_options(self) -> dict[str, Any]:
        """What every redis-py connection gets: timeouts, TLS, RESP2, and no retries at all.

        A retried append could store a record twice without anyone knowing, and a dead server must
        surface promptly instead of after rounds of back-off.
        """
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "retry": Retry(NoBackoff(), 0),
            "protocol": 2,
            **self.ssl,
        }
