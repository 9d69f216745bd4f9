"""``flask config check``: the resolved configuration, secrets masked, each value with its source."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Mapping

from dotenv import dotenv_values

from . import checks, resolve
from .model import Settings
from .redis_target import ConfigurationError, RedisTarget, mask_url

__all__ = ["report_lines", "shown_value"]


def _names_of(config: Settings, name: str) -> list[str]:
    field = type(config).model_fields[name]
    choices = getattr(field.validation_alias, "choices", None)
    names = [choice for choice in choices if isinstance(choice, str)] if choices else []
    return names or [name]


def _source(config: Settings, name: str, environ: Mapping[str, str], dotenv: Mapping[str, str | None]) -> str:
    for alias in _names_of(config, name):
        as_alias = "" if alias == name else f", as {alias}"
        # The environment wins over the file; the flask command loads the file into the environment too
        # (without overriding), so a value equal to the file's came from the file.
        if dotenv.get(alias) and environ.get(alias, dotenv[alias]) == dotenv[alias]:
            return ".env" + as_alias
        if environ.get(alias):
            return "environment" + as_alias
    return "set by the caller" if config.given(name) else "default"


def shown_value(config: Settings, name: str) -> str:
    """The value of setting ``name`` as it may be printed: secrets are masked, URLs keep their hosts."""
    value = getattr(config, name)
    extra = type(config).model_fields[name].json_schema_extra
    secret = isinstance(extra, dict) and bool(extra.get("secret"))
    if value is None or value == "":
        return "(unset)"
    if secret:
        text = str(value)
        return mask_url(text) if "://" in text else "***"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _resolved(label: str, compute: Callable[[], resolve.Resolved | None]) -> str:
    try:
        found = compute()
    except ConfigurationError as exc:
        return f"  {label:<16} (refused: {exc})"
    if found is None:
        return f"  {label:<16} (none)"
    return f"  {label:<16} {found.masked()}    [{found.source}]"


def _redis(found: tuple[RedisTarget, str] | None) -> resolve.Resolved | None:
    return None if found is None else resolve.Resolved(found[0].stream_url(), found[1])


def report_lines(
    config: Settings, environ: Mapping[str, str] | None = None, env_file: str | pathlib.Path = ".env"
) -> tuple[list[str], list[str]]:
    """The report's lines, and the problems that would stop the service (empty: it would start)."""
    environ = dict(os.environ) if environ is None else environ
    path = pathlib.Path(env_file)
    dotenv = dotenv_values(path) if path.is_file() else {}
    lines = [
        f"DEPLOY_ENV={config.DEPLOY_ENV}",
        "resolved:",
        _resolved("app database", lambda: resolve.database(config)),
        _resolved("stream store", lambda: resolve.stream_store(config)),
        _resolved("Celery broker", lambda: resolve.broker(config)),
        _resolved("app's Redis", lambda: _redis(resolve.main_redis(config))),
        _resolved("event bus Redis", lambda: _redis(resolve.event_bus_redis(config))),
        "settings:",
    ]
    for name in sorted(type(config).model_fields):
        lines.append(f"  {name}={shown_value(config, name)}    [{_source(config, name, environ, dotenv)}]")
    found = checks.problems(config, checks.given_names(environ, path))
    lines.append("problems:" if found else "problems: none")
    lines.extend(f"  {problem}" for problem in found)
    return lines, found
