"""One Redis deployment, whichever way it was given: our URL forms or Dify's ``REDIS_*`` parts.

A :class:`RedisTarget` is what the stream store, the app's Redis client, the event bus and the
startup checks are built from; it renders itself as the stream adapter's URL (``redis://``,
``rediss://``, ``redis+sentinel://``, ``redis+cluster://``) and, masked, for ``flask config check``.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Literal

__all__ = ["ConfigurationError", "HostPort", "RedisTarget", "host_ports", "mask_url"]

HostPort = tuple[str, int]
Mode = Literal["standalone", "sentinel", "cluster"]


class ConfigurationError(Exception):
    """A setting the process cannot start with; ``str()`` is one line naming the setting(s)."""


def host_ports(raw: str | None, setting: str) -> tuple[HostPort, ...]:
    """``host:port,host:port`` (blank entries skipped); a malformed entry is named by position only, since
    an operator who pasted ``password@host`` would otherwise see the password in the error.

    Raises:
        ConfigurationError: An entry is not ``host:port``.
    """
    found: list[HostPort] = []
    for index, entry in enumerate((raw or "").split(","), start=1):
        entry = entry.strip()
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(f"{setting}: entry {index} is not host:port")
        found.append((host.strip("[]"), int(port)))
    return tuple(found)


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (the rest is shown: it says where things are)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:***@{hosts}" if colon else f"{userinfo}@{hosts}"
    query_masked = tail
    if "?" in tail:
        path, _, query = tail.partition("?")
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query_masked = path + "?" + "&".join(f"{k}={'***' if 'password' in k else v}" for k, v in pairs)
    return f"{scheme}://{netloc}{slash}{query_masked}"


@dataclasses.dataclass(frozen=True)
class RedisTarget:
    """A Redis deployment: one server, the primary some sentinels name, or a cluster."""

    mode: Mode
    host: str = "localhost"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    #: ``ssl_cert_reqs`` (``none``/``optional``/``required``), ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``.
    ssl_options: tuple[tuple[str, str], ...] = ()
    sentinels: tuple[HostPort, ...] = ()
    service: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    sentinel_socket_timeout: float = 0.1
    nodes: tuple[HostPort, ...] = ()

    @classmethod
    def from_url(cls, url: str, setting: str, *, cluster: bool = False) -> RedisTarget:
        """Parse one of our URL forms (``cluster``: Dify's event-bus form, ``redis://[:pw@]h1:p1,h2:p2``).

        Raises:
            ConfigurationError: Not a Redis URL this service understands.
        """
        parts = urllib.parse.urlsplit(url.strip())
        scheme = parts.scheme.lower()
        username = urllib.parse.unquote(parts.username) if parts.username else None
        password = urllib.parse.unquote(parts.password) if parts.password is not None else None
        hosts = parts.netloc.rpartition("@")[2]
        query = dict(urllib.parse.parse_qsl(parts.query))
        if scheme == "redis+cluster" or (cluster and scheme in ("redis", "rediss")):
            nodes = host_ports(hosts, setting)
            if not nodes:
                raise ConfigurationError(f"{setting} names no cluster node")
            return cls("cluster", username=username, password=password or None, tls=scheme == "rediss", nodes=nodes)
        if scheme in ("redis+sentinel", "rediss+sentinel"):
            segments = [segment for segment in parts.path.split("/") if segment]
            if not segments or len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
                raise ConfigurationError(f"{setting}: a redis+sentinel:// URL's path is /<service>[/<db>]")
            return cls(
                "sentinel",
                db=int(segments[1]) if len(segments) == 2 else 0,
                username=username,
                password=password or None,
                tls=scheme == "rediss+sentinel",
                sentinels=host_ports(hosts, setting),
                service=urllib.parse.unquote(segments[0]),
                sentinel_username=query.get("sentinel_username"),
                sentinel_password=query.get("sentinel_password"),
                sentinel_socket_timeout=float(query.get("sentinel_socket_timeout", 0.1)),
            )
        if scheme not in ("redis", "rediss"):
            raise ConfigurationError(f"{setting} is not a Redis URL (redis://, rediss://, redis+sentinel://, …)")
        db_text = parts.path.strip("/") or "0"
        if not db_text.isdigit():
            raise ConfigurationError(f"{setting}: the database number must be a number")
        try:
            port = parts.port or 6379
        except ValueError as exc:
            raise ConfigurationError(f"{setting}: the port is not a number") from exc
        ssl = tuple(sorted((key, value) for key, value in query.items() if key.startswith("ssl_")))
        return cls(
            "standalone",
            host=parts.hostname or "localhost",
            port=port,
            db=int(db_text),
            username=username,
            password=password or None,
            tls=scheme == "rediss",
            ssl_options=ssl,
        )

    def stream_url(self) -> str:
        """The stream adapter's URL of this deployment (docs/adapters/redis.md), secrets included."""
        userinfo = ""
        if self.username or self.password:
            user = urllib.parse.quote(self.username or "", safe="")
            userinfo = f"{user}:{urllib.parse.quote(self.password or '', safe='')}@" if self.password else f"{user}@"
        query: list[tuple[str, str]] = []
        if self.mode == "cluster":
            hosts = ",".join(f"{host}:{port}" for host, port in self.nodes)
            return f"redis+cluster://{userinfo}{hosts}"
        if self.mode == "sentinel":
            hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            if self.sentinel_username:
                query.append(("sentinel_username", self.sentinel_username))
            if self.sentinel_password:
                query.append(("sentinel_password", self.sentinel_password))
            query.append(("sentinel_socket_timeout", f"{self.sentinel_socket_timeout:g}"))
            if self.tls:
                query.extend(self.ssl_options)
            scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
            return f"{scheme}://{userinfo}{hosts}/{urllib.parse.quote(self.service or '', safe='')}/{self.db}?" + (
                urllib.parse.urlencode(query)
            )
        if self.tls:
            query.extend(self.ssl_options)
        scheme = "rediss" if self.tls else "redis"
        url = f"{scheme}://{userinfo}{self.host}:{self.port}/{self.db}"
        return f"{url}?{urllib.parse.urlencode(query)}" if query else url

    def describe(self) -> str:
        """Masked, for logs and ``flask config check``."""
        return mask_url(self.stream_url())

    def client_ssl_kwargs(self) -> dict[str, str]:
        """redis-py's ``ssl_*`` keyword arguments (only with TLS)."""
        return dict(self.ssl_options) if self.tls else {}
