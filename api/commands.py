"""The ``flask`` commands: apps and their credentials, one reaper sweep, and ``config check``.

Run as ``flask --app api.app <command>`` with the service's environment. ``config check`` prints what
the settings resolve to (secrets masked, each value with its source) and the problems that would stop
the service, and exits 1 when there are any: it works even when the API would refuse to start.
"""

from __future__ import annotations

import json
import pathlib

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

        definition = json.loads(pathlib.Path(path).read_text())
        try:
            created = app_service.create_app(definition)
        except ServiceError as exc:
            raise click.ClickException(exc.message) from exc
        click.echo(
            json.dumps(
                {"app_id": created.id, "name": created.name, "api_key": created.api_key, "site_code": created.site_code}
            )
        )

    @app.cli.command("reap-expired-runs")
    def reap_command() -> None:
        """One reaper sweep: end runs whose worker died or never started them, write pending ends."""
        from api.services.run_recovery import reap

        click.echo(str(reap()))


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
