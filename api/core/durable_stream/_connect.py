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

if TYPE_CHECKING:
    from ._backend import DurableStreamBackend
    from ._driver import Driver

__all__ = ["SCHEMES", "Options", "connect"]

#: URL scheme -> module (relative to this package) whose ``open_driver(url, options)`` builds a driver.
SCHEMES: Mapping[str, str] = {
    "memory": "._memory",
    "sqlite": "._sqlite",
    "postgresql": "._postgres",
    "postgresql+psycopg": "._postgres",
    "postgres": "._postgres",
    "redis": "._redis",
    "rediss": "._redis",
    "redis+cluster": "._redis",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class Options:
    """Typed access to connection options, each consumed at most once."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def _pop(self, name: str) -> Any:
        return self._values.pop(name, None)

    def pop_str(self, name: str, default: str | None = None) -> str | None:
        value = self._pop(name)
        return default if value is None else str(value)

    def pop_int(self, name: str, default: int | None = None, *, minimum: int | None = None) -> int | None:
        value = self._pop(name)
        if value is None:
            return default
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"option {name!r} must be an integer, got {value!r}") from None
        if minimum is not None and number < minimum:
            raise ValueError(f"option {name!r} must be at least {minimum}, got {number}")
        return number

    def pop_float(self, name: str, default: float | None = None, *, minimum: float | None = None) -> float | None:
        value = self._pop(name)
        if value is None:
            return default
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"option {name!r} must be a number, got {value!r}") from None
        if minimum is not None and number < minimum:
            raise ValueError(f"option {name!r} must be at least {minimum}, got {number}")
        return number

    def pop_bool(self, name: str, default: bool) -> bool:
        value = self._pop(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"option {name!r} must be a boolean, got {value!r}")

    def ensure_consumed(self, scheme: str) -> None:
        if self._values:
            unknown = ", ".join(sorted(self._values))
            raise ValueError(f"unknown option(s) for {scheme}:// backends: {unknown}")


def connect(url: str, **options: Any) -> DurableStreamBackend:
    """Open a durable-stream backend for ``url``.

    Supported schemes are listed in :data:`SCHEMES`; each adapter's module docstring documents its
    URL form and options. ``buffer_size`` (records held per subscription, default 128) applies to
    every adapter.

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
    assert buffer_size is not None
    # Cut the query off the text itself: urlunsplit() drops an empty authority ("sqlite:///x" -> "sqlite:/x").
    base_url = url.partition("?")[0]
    module = importlib.import_module(module_name, __package__)
    driver: Driver = module.open_driver(base_url, values)
    try:
        values.ensure_consumed(scheme)
    except ValueError:
        driver.close()
        raise
    return DurableStreamBackend(driver, buffer_size=buffer_size, url=_redact(parts))


def _redact(parts: urllib.parse.SplitResult) -> str:
    """The URL without password or query, for reprs and logs."""
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
    # Not urlunsplit: it drops an empty host, turning sqlite:////abs/path into sqlite://abs/path.
    return f"{parts.scheme}://{netloc}{parts.path}"
