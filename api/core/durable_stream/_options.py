"""Connection options: typed access to ``connect()`` keyword arguments and URL query values.

A leaf module (standard library only) so that adapters parse their settings without importing the
:func:`~api.core.durable_stream.connect` entry module. Each option is consumed at most once; what
is left over after an adapter has read its settings is an error rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

__all__ = ["Options"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class Options:
    """Typed access to connection options, each consumed at most once.

    With a default, ``pop_*`` returns that type; without one it returns ``None`` for an absent
    option, so an adapter's settings never need an ``assert`` after parsing.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def _pop(self, name: str) -> Any:
        return self._values.pop(name, None)

    @overload
    def pop_str(self, name: str, default: str) -> str: ...

    @overload
    def pop_str(self, name: str, default: None = None) -> str | None: ...

    def pop_str(self, name: str, default: str | None = None) -> str | None:
        value = self._pop(name)
        return default if value is None else str(value)

    @overload
    def pop_int(self, name: str, default: int, *, minimum: int | None = None) -> int: ...

    @overload
    def pop_int(self, name: str, default: None = None, *, minimum: int | None = None) -> int | None: ...

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

    @overload
    def pop_float(self, name: str, default: float, *, minimum: float | None = None) -> float: ...

    @overload
    def pop_float(self, name: str, default: None = None, *, minimum: float | None = None) -> float | None: ...

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
