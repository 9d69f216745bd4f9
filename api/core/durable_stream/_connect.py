"""``connect(url, **options)``: the single way to open a backend.

Adapters are looked up by URL scheme and imported only when used, so importing the library needs
no driver package. Options come from keyword arguments or from the URL's query string (keyword
arguments win); unknown options are an error rather than silently ignored.
"""

from __future__ import annotations

import importlib
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._options import Options

if TYPE_CHECKING:
    from ._backend import DurableStreamBackend
    from ._driver import Driver

__all__ = ["SCHEMES", "adapter_name", "connect", "redact_url"]

#: URL scheme -> module (relative to this package) whose ``open_driver(url, options)`` builds a driver.
#: Each is the ``driver`` module of an adapter sub-package (see :mod:`.adapters`), imported on first use.
SCHEMES: Mapping[str, str] = {
    "memory": ".adapters.memory.driver",
    "sqlite": ".adapters.sqlite.driver",
    "postgresql": ".adapters.postgres.driver",
    "postgresql+psycopg": ".adapters.postgres.driver",
    "postgres": ".adapters.postgres.driver",
    "redis": ".adapters.redis.driver",
    "rediss": ".adapters.redis.driver",
    "redis+cluster": ".adapters.redis.driver",
    "redis+sentinel": ".adapters.redis.driver",
    "rediss+sentinel": ".adapters.redis.driver",
    "nats": ".adapters.nats.driver",
    "tls": ".adapters.nats.driver",
}


def adapter_name(url: str) -> str | None:
    """The name of the adapter ``url`` opens (``postgresql+psycopg://…`` is ``postgres``), as observers see
    it; ``None`` for an unknown scheme."""
    module_name = SCHEMES.get(urllib.parse.urlsplit(url).scheme.lower())
    return None if module_name is None else module_name.split(".")[2]


def connect(url: str, **options: Any) -> DurableStreamBackend:
    """Open a durable-stream backend for ``url``.

    Supported schemes are listed in :data:`SCHEMES`; each adapter sub-package's docstring (its
    capability card, rendered to ``docs/adapters/``) documents its URL form and options.
    ``buffer_size`` (records held per subscription, default 128) applies to every adapter.

    Raises:
        ValueError: The URL's scheme is not supported or an option is unknown or invalid.
        DurableStreamUnavailableError: The backend cannot be reached.
    """
    from ._backend import DEFAULT_BUFFER_SIZE, DurableStreamBackend

    if not isinstance(url, str):
        raise TypeError("url must be a string")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    module_name = SCHEMES.get(scheme)
    if module_name is None:
        supported = ", ".join(f"{name}://" for name in SCHEMES)
        raise ValueError(f"unsupported durable-stream URL scheme {parts.scheme!r}; supported: {supported}")
    merged: dict[str, Any] = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    merged.update(options)
    values = Options(merged)
    buffer_size = values.pop_int("buffer_size", DEFAULT_BUFFER_SIZE, minimum=1)
    # Cut the query off the text itself: urlunsplit() drops an empty authority ("sqlite:///x" -> "sqlite:/x").
    base_url = url.partition("?")[0]
    module = importlib.import_module(module_name, __package__)
    driver: Driver = module.open_driver(base_url, values)
    try:
        values.ensure_consumed(scheme)
    except ValueError:
        driver.close()
        raise
    # The adapter's package names the backend for observers: "postgresql+psycopg://" is "postgres".
    name = module_name.split(".")[2]
    return DurableStreamBackend(driver, buffer_size=buffer_size, url=redact_url(parts), name=name)


def redact_url(parts: urllib.parse.SplitResult) -> str:
    """The URL without password or query, for reprs and logs."""
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
    # Not urlunsplit: it drops an empty host, turning sqlite:////abs/path into sqlite://abs/path.
    return f"{parts.scheme}://{netloc}{parts.path}"
