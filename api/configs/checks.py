"""What a process refuses to start with, each as one line naming the setting(s) to fix.

- Settings that cannot be resolved or that disagree (:mod:`api.configs.resolve`).
- Outside ``DEPLOY_ENV=DEVELOPMENT``: the built-in ``SECRET_KEY``, Dify's published example key, or a
  key shorter than 32 bytes (anyone could forge passports and resume tokens with them).
- A setting that starts with one of this service's own prefixes but is not one of its settings (a
  typo would otherwise be ignored silently): the message says which setting was probably meant.
"""

from __future__ import annotations

import difflib
import os
import pathlib
from collections.abc import Iterable, Mapping

from dotenv import dotenv_values

from . import resolve
from .model import Settings
from .redis_target import ConfigurationError
from .service import DEVELOPMENT_SECRET_KEY

__all__ = [
    "OWN_PREFIXES",
    "alias_problems",
    "given_names",
    "known_names",
    "problems",
    "secret_key_problem",
    "unknown_setting_problems",
]

#: Prefixes only this service uses (none of Dify's settings starts with one): an unknown name with one
#: of them is a typo. Shared prefixes (REDIS_, DB_, CELERY_, WORKFLOW_, APP_, …) cannot be checked: a
#: Dify ``.env`` holds hundreds of settings this service has no use for.
OWN_PREFIXES = (
    "DURABLE_STREAM",
    "SSE_",
    "RESUME_TOKEN",
    "BROADCAST_CHANNEL",
    "WORKFLOW_EVENT_",
    "BEAT_",
    "METRICS_",
    "API_METRICS",
    "API_REAPER",
    "WORKER_METRICS",
    "WEB_WORKER_",
    "DEMO_PAGE",
    "LIMIT_",
    "CREDENTIAL_",
)
#: Dify's published example SECRET_KEY (docker/.env.example): as public as the built-in one.
DIFY_EXAMPLE_SECRET_KEY = "sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U"
MIN_SECRET_KEY_BYTES = 32


def known_names() -> set[str]:
    """Every name a setting is read under: field names and their aliases."""
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        names.add(name)
        alias = field.validation_alias
        choices = getattr(alias, "choices", None)
        if choices is not None:
            names.update(choice for choice in choices if isinstance(choice, str))
        elif isinstance(alias, str):
            names.add(alias)
    return names


def unknown_setting_problems(names: Iterable[str]) -> list[str]:
    known = known_names()
    found = []
    for name in sorted(set(names)):
        if name in known or not name.startswith(OWN_PREFIXES):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "; docs/configuration.md lists every setting"
        found.append(f"unknown setting {name}{hint}")
    return found


def given_names(environ: Mapping[str, str] | None = None, env_file: str | pathlib.Path = ".env") -> dict[str, str]:
    """The settings set in the environment and in the ``.env`` file the settings read, by name (the
    environment's value where both set one, as the settings themselves take it)."""
    given: dict[str, str] = {}
    path = pathlib.Path(env_file)
    if path.is_file():
        given.update({name: value for name, value in dotenv_values(path).items() if value})
    given.update({name: value for name, value in (os.environ if environ is None else environ).items() if value})
    return given


def alias_problems(given: Mapping[str, str]) -> list[str]:
    """Two names of one setting (``BROADCAST_CHANNEL_TYPE`` and Dify's ``EVENT_BUS_REDIS_CHANNEL_TYPE``, say)
    set to different values: only one would be read, silently."""
    found = []
    for field in Settings.model_fields.values():
        choices = [name for name in getattr(field.validation_alias, "choices", None) or () if isinstance(name, str)]
        set_here = [(name, given[name]) for name in choices if name in given]
        if len({value.strip().lower() for _, value in set_here}) > 1:
            (first, one), (second, other) = set_here[0], set_here[1]
            found.append(f"{first}={one} and {second}={other} name the same setting and disagree: set one of them")
    return found


def secret_key_problem(config: Settings) -> str | None:
    if config.development:
        return None
    hint = "set SECRET_KEY to a random value of at least 32 bytes (e.g. openssl rand -base64 42)"
    if config.SECRET_KEY == DEVELOPMENT_SECRET_KEY:
        return f"SECRET_KEY is the built-in development key, with which anyone can forge passports: {hint}"
    if config.SECRET_KEY == DIFY_EXAMPLE_SECRET_KEY:
        return f"SECRET_KEY is Dify's published example key, with which anyone can forge passports: {hint}"
    size = len(config.SECRET_KEY.encode())
    if size < MIN_SECRET_KEY_BYTES:
        return f"SECRET_KEY is {size} bytes long: {hint}"
    return None


def problems(config: Settings, given: Mapping[str, str] | Iterable[str] = (), *, gateway: bool = False) -> list[str]:
    """Every reason ``config`` cannot serve (empty: it can); ``given`` are the settings set (names, or names
    and values), for typos and for two names of one setting that disagree.
    The ``gateway`` on its own queues no task and signs nothing: it needs no broker and no ``SECRET_KEY``.

    Reachability is not checked here (``api.startup`` does that, once the settings are sound).
    """
    found = unknown_setting_problems(given)
    if isinstance(given, Mapping):
        found += alias_problems(given)
    checks = [resolve.database, resolve.stream_store, resolve.main_redis, resolve.event_bus_redis]
    if not gateway:
        checks.append(resolve.broker)
    for check in checks:
        try:
            check(config)
        except ConfigurationError as exc:
            if str(exc) not in found:
                found.append(str(exc))
    if config.WORKFLOW_EVENT_TRANSPORT == "broadcast_channel" and not found:
        bus = resolve.event_bus_redis(config)
        if bus is None:
            found.append(
                "WORKFLOW_EVENT_TRANSPORT=broadcast_channel needs a Redis: set EVENT_BUS_REDIS_URL, REDIS_URL or "
                "Dify's REDIS_HOST"
            )
        elif bus[0].mode == "cluster" and config.BROADCAST_CHANNEL_TYPE != "pubsub":
            found.append(
                f"EVENT_BUS_REDIS_CHANNEL_TYPE={config.BROADCAST_CHANNEL_TYPE} on a Redis Cluster ({bus[1]}) is not "
                "served by this broadcast channel yet: use pubsub there, or a standalone or Sentinel Redis"
            )
    secret = None if gateway else secret_key_problem(config)
    if secret is not None:
        found.append(secret)
    return found
