"""Starting a process: its settings checked, a refusal told in one line per problem, never a traceback.

Every entry point (``api.app``, ``api.celery_entrypoint``, ``api.durable_streams_app``, the gunicorn
master through ``api.gunicorn_conf``) goes through :func:`serving_app` or :func:`check_or_exit`. A
refusal prints ``configuration error: <problem>`` on stderr for each problem and exits non-zero: 1, or
3 in a gunicorn worker (gunicorn's "worker failed to boot", which stops its master instead of
restarting the worker for ever).

``flask … config check`` is the exception: it must describe a configuration that cannot start, so
when that command is asked for, a bare app that knows only it is served instead of a refusal.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable
from typing import Literal, NoReturn

from flask import Flask

from api.configs import AppConfig, ConfigurationError, load_config
from api.configs import checks as config_checks

__all__ = ["Role", "check_or_exit", "problems_of", "refuse", "serving_app"]

Role = Literal["api", "worker", "gateway"]
#: A gunicorn worker that exits with this code makes its master stop ("Worker failed to boot.").
GUNICORN_WORKER_BOOT_ERROR = 3


def problems_of(config: AppConfig, role: Role) -> list[str]:
    """Why ``config`` cannot serve ``role``."""
    return config_checks.problems(config, config_checks.given_names(), gateway=role == "gateway")


def refuse(problems: list[str] | str) -> NoReturn:
    """Print each problem on one line and exit non-zero."""
    lines = problems.splitlines() if isinstance(problems, str) else problems
    for line in lines:
        print(f"configuration error: {line}", file=sys.stderr, flush=True)
    in_gunicorn_worker = "gunicorn.workers.base" in sys.modules and "gunicorn.arbiter" in sys.modules
    raise SystemExit(GUNICORN_WORKER_BOOT_ERROR if in_gunicorn_worker else 1)


def check_or_exit(role: Role) -> AppConfig:
    """The settings, or a refusal (the gunicorn master calls this before it starts any worker)."""
    try:
        config = load_config()
    except ConfigurationError as exc:
        refuse(str(exc))
    found = problems_of(config, role)
    if found:
        refuse(found)
    return config


def _config_check_asked() -> bool:
    """Whether this process is ``flask … config check``."""
    args = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    if pathlib.Path(sys.argv[0]).name != "flask" or "config" not in args:
        return False
    return args[args.index("config") + 1 :][:1] == ["check"]


def serving_app(role: Role, build: Callable[[AppConfig], Flask]) -> Flask:
    """``build(config)`` once the settings are sound and what they name is reachable; else a refusal."""
    try:
        config = load_config()
    except ConfigurationError as exc:
        if _config_check_asked():
            return _config_check_app(None)
        refuse(str(exc))
    found = problems_of(config, role)
    if found and _config_check_asked():
        return _config_check_app(config)
    if found:
        refuse(found)
    try:
        return build(config)
    except ConfigurationError as exc:
        if _config_check_asked():
            return _config_check_app(config)
        refuse(str(exc))


def _config_check_app(config: AppConfig | None) -> Flask:
    from api.commands import register_config_commands

    app = Flask("api")
    register_config_commands(app, config)
    return app
