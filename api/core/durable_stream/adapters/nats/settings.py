"""Settings of the NATS JetStream adapter, parsed once from the URL and the connection options."""

from __future__ import annotations

import dataclasses
import re
import urllib.parse

from ..._options import Options

__all__ = ["DEFAULT_STREAM", "DEFAULT_SUBJECT_PREFIX", "LIVE_SUBJECTS", "NatsSettings"]

DEFAULT_STREAM = "DURABLE_STREAM"
DEFAULT_SUBJECT_PREFIX = "ds"
_STREAM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_STORAGE = ("file", "memory")
#: The first token of the subjects the stream republishes on (``jetstream.LIVE_PREFIX``).
LIVE_SUBJECTS = "_DSLIVE"


@dataclasses.dataclass(frozen=True, slots=True)
class NatsSettings:
    #: ``nats://host:port,...`` as server URLs (credentials kept in each URL).
    servers: tuple[str, ...]
    #: The JetStream stream holding every topic of this store (one per deployment).
    stream: str = DEFAULT_STREAM
    #: Subjects of topics are ``<subject_prefix>.<encoded topic name>``; the stream captures ``<prefix>.>``.
    subject_prefix: str = DEFAULT_SUBJECT_PREFIX
    #: ``max_msgs_per_subject`` of the stream (0: unlimited); a seal marker counts as one.
    max_records: int = 0
    #: ``max_age`` of the stream (``None``: records never expire).
    max_age_seconds: float | None = None
    #: ``num_replicas`` of the stream (1, 3 or 5 in a cluster).
    replicas: int = 1
    #: ``file`` or ``memory`` storage for the stream.
    storage: str = "file"
    #: Seconds per request (appends, reads, admin calls).
    request_timeout: float = 5.0
    connect_timeout: float = 2.0
    #: Seconds between the change feed's checks of the watched topics' heads.
    poll_interval: float = 1.0
    #: Uncontended appends go out from the caller's thread on a second, publishing connection
    #: (:mod:`.publisher`); ``False`` keeps one connection per backend object.
    direct_publish: bool = True
    #: Connection name shown in the server's monitoring.
    name: str = "durable_stream"
    user: str | None = None
    password: str | None = None
    token: str | None = None
    #: Path of a ``.creds`` file (JWT + NKey seed).
    creds: str | None = None
    #: Path of an NKey seed file.
    nkeys_seed: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    #: ``tls://`` URL or any ``tls_*`` option given.
    tls: bool = False

    @classmethod
    def from_url(cls, url: str, options: Options) -> NatsSettings:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("nats", "tls"):
            raise ValueError(f"not a NATS URL: {url!r}")
        userinfo, _, hosts = parts.netloc.rpartition("@")
        if not hosts:
            raise ValueError("a NATS URL needs at least one host:port")
        if parts.path not in ("", "/"):
            raise ValueError(f"a NATS URL has no path, got {parts.path!r}")
        prefix = f"{scheme}://" + (f"{userinfo}@" if userinfo else "")
        servers = tuple(prefix + host.strip() for host in hosts.split(",") if host.strip())
        stream = options.pop_str("stream", DEFAULT_STREAM)
        if not _STREAM_NAME.match(stream):
            raise ValueError(f"option 'stream' must be letters, digits, '_' or '-' (at most 64), got {stream!r}")
        subject_prefix = options.pop_str("subject_prefix", DEFAULT_SUBJECT_PREFIX)
        if not _PREFIX.match(subject_prefix):
            raise ValueError(f"option 'subject_prefix' must be dot-separated plain tokens, got {subject_prefix!r}")
        if subject_prefix.partition(".")[0] == LIVE_SUBJECTS:
            raise ValueError(f"option 'subject_prefix' may not start with {LIVE_SUBJECTS!r} (the adapter's subjects)")
        storage = options.pop_str("storage", "file").lower()
        if storage not in _STORAGE:
            raise ValueError(f"option 'storage' must be one of {_STORAGE}, got {storage!r}")
        replicas = options.pop_int("replicas", 1, minimum=1)
        if replicas > 5:
            raise ValueError("option 'replicas' must be at most 5")
        tls_options = {name: options.pop_str(name) for name in ("tls_ca", "tls_cert", "tls_key", "tls_hostname")}
        return cls(
            servers=servers,
            stream=stream,
            subject_prefix=subject_prefix,
            max_records=options.pop_int("max_records", 0, minimum=0),
            max_age_seconds=options.pop_float("max_age_seconds", minimum=0.001),
            replicas=replicas,
            storage=storage,
            request_timeout=options.pop_float("request_timeout", 5.0, minimum=0.01),
            connect_timeout=options.pop_float("connect_timeout", 2.0, minimum=0.01),
            poll_interval=options.pop_float("poll_interval", 1.0, minimum=0.01),
            direct_publish=options.pop_bool("direct_publish", True),
            name=options.pop_str("name", "durable_stream"),
            user=options.pop_str("user"),
            password=options.pop_str("password"),
            token=options.pop_str("token"),
            creds=options.pop_str("creds"),
            nkeys_seed=options.pop_str("nkeys_seed"),
            tls=scheme == "tls" or any(value is not None for value in tls_options.values()),
            **tls_options,
        )
