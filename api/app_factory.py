"""Builds the Flask app: settings, extensions, blueprints and CLI commands."""

from __future__ import annotations

import json
import pathlib

import click
from flask import Flask

from api.configs import AppConfig


def create_app(config: AppConfig | None = None) -> Flask:
    config = config or AppConfig()
    app = Flask("api")
    app.config["SECRET_KEY"] = config.SECRET_KEY
    app.config["APP_CONFIG"] = config

    from api.extensions import (
        ext_celery,
        ext_database,
        ext_durable_stream,
        ext_event_bus,
        ext_redis,
    )

    ext_database.init_app(app, config)
    ext_redis.init_app(app, config)
    ext_durable_stream.init_app(app, config)
    ext_event_bus.init_app(app, config)  # after ext_redis and ext_durable_stream, which it uses
    ext_celery.init_app(app, config)

    from api.libs import request_limits
    from api.services.delivery.runtime import init_app as init_delivery

    request_limits.init_app(app, config)
    init_delivery(app, config)  # the process's token codec, run watcher and shared writers, built once

    import api.tasks  # noqa: F401  (registers the Celery tasks)
    from api.controllers.browser import bp as browser_bp
    from api.controllers.health import bp as health_bp
    from api.controllers.service_api import bp as service_api_bp
    from api.controllers.web import bp as web_bp
    from api.libs.external_api import http_error_response
    from api.services.file_service import largest_upload

    app.register_blueprint(service_api_bp)
    # Files and audio are uploaded whole: their routes take bodies up to the largest file they accept.
    request_limits.allow_larger_bodies(
        app, {"service_api.fileuploadapi": largest_upload(config), "service_api.audiototextapi": 31 << 20}
    )
    app.register_blueprint(web_bp)
    app.register_blueprint(browser_bp)
    app.register_blueprint(health_bp)
    if config.DURABLE_STREAMS_GATEWAY_PREFIX.strip("/"):
        from api.controllers.durable_streams import create_blueprint

        app.register_blueprint(create_blueprint(config.DURABLE_STREAMS_GATEWAY_PREFIX))
    app.register_error_handler(Exception, http_error_response)
    _register_commands(app)
    return app


def _register_commands(app: Flask) -> None:
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
