"""The ``flask`` commands: apps and their credentials, one reaper sweep, and ``config check``.

``flask apps rotate-key APP``, ``revoke-key KEY`` (both with ``--grace SECONDS``), ``revoke-passports APP``
and ``rotate-site-code APP`` change an app's credentials; every API process refuses the old ones within
``CREDENTIAL_CHECK_INTERVAL`` (``api.services.credentials``). Each prints the app's id and its current
key and site code as JSON.

Run as ``flask --app api.app <command>`` with the service's environment. ``config check`` prints what
the settings resolve to (secrets masked, each value with its source) and the problems that would stop
the service, and exits 1 when there are any: it works even when the API would refuse to start.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import click
from flask import Flask
from flask.cli import AppGroup

from api.configs import AppConfig, ConfigurationError, load_config
from api.configs.report import report_lines

__all__ = ["register_commands", "register_config_commands"]


def register_commands(app: Flask) -> None:
    register_config_commands(app, app.config["APP_CONFIG"])

    @app.cli.command("create-app")
    @click.option("--file", "path", required=True, type=click.Path(exists=True, dir_okay=False))
    def create_app_command(path: str) -> None:
        """Create an app from a workflow definition file and print its id and API key."""
        from api.libs.errors import ServiceError
        from api.services import app_service

        try:
            created = app_service.create_app(app_service.read_definition(pathlib.Path(path).read_text()))
        except ServiceError as exc:
            raise click.ClickException(exc.message) from exc
        click.echo(
            json.dumps(
                {"app_id": created.id, "name": created.name, "api_key": created.api_key, "site_code": created.site_code}
            )
        )

    app.cli.add_command(_apps_group())

    @app.cli.command("reap-expired-runs")
    def reap_command() -> None:
        """One reaper sweep: end runs whose worker died or never started them, write pending ends."""
        from api.services.run_recovery import reap

        click.echo(str(reap()))


def _echo_app(app: Any) -> None:
    click.echo(json.dumps({"app_id": app.id, "api_key": app.api_key, "site_code": app.site_code}))


def _apps_group() -> AppGroup:
    from api.libs.errors import ServiceError
    from api.services import credentials

    group = AppGroup("apps", help="Apps' credentials: rotate and revoke API keys, site codes and passports.")
    grace_option = click.option(
        "--grace",
        type=click.FloatRange(min=0),
        default=0,
        show_default=True,
        help="Seconds the replaced key is still accepted (a planned rotation); 0 refuses it at once.",
    )

    def run(change: Callable[[], Any]) -> None:
        try:
            _echo_app(change())
        except ServiceError as exc:
            raise click.ClickException(exc.message) from exc

    @group.command("rotate-key")
    @click.argument("app_id")
    @grace_option
    def rotate_key(app_id: str, grace: float) -> None:
        """Give APP_ID a new API key; refuse the old one (after --grace) and the app's passports."""
        run(lambda: credentials.rotate_key(app_id, grace))

    @group.command("revoke-key")
    @click.argument("key")
    @grace_option
    def revoke_key(key: str, grace: float) -> None:
        """Refuse KEY (after --grace): its app gets a new key, and its passports are refused."""
        run(lambda: credentials.revoke_key(key, grace))

    @group.command("revoke-passports")
    @click.argument("app_id")
    def revoke_passports(app_id: str) -> None:
        """Refuse every passport of APP_ID minted until now."""
        run(lambda: credentials.revoke_passports(app_id))

    @group.command("rotate-site-code")
    @click.argument("app_id")
    def rotate_site_code(app_id: str) -> None:
        """Give APP_ID a new site code; refuse the passports minted with the old one."""
        run(lambda: credentials.rotate_site_code(app_id))

    return group


def register_config_commands(app: Flask, config: AppConfig | None) -> None:
    """``flask config check``; ``config`` is ``None`` when the settings did not even parse."""
    group = AppGroup("config", help="The service's settings.")

    @group.command("check")
    def check_command() -> None:
        """Print the resolved configuration (secrets masked, each value's source) and its problems."""
        try:
            settings = config or load_config()
        except ConfigurationError as exc:
            for line in str(exc).splitlines():
                click.echo(f"problem: {line}", err=True)
            raise SystemExit(1) from None
        lines, problems = report_lines(settings)
        click.echo("\n".join(lines))
        if problems:
            raise SystemExit(1)

    app.cli.add_command(group)
