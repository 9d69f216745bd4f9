"""Builds the Flask app: settings, extensions, blueprints and CLI commands."""

from __future__ import annotations

from typing import Any

from flask import Flask
from flask.sessions import SessionInterface

from api.configs import AppConfig, ConfigurationError, checks, load_config


def create_app(config: AppConfig | None = None) -> Flask:
    """The API's (and the Celery worker's) app.

    Raises:
        ConfigurationError: ``config`` cannot serve (one line per problem; ``api.configs.checks``), or the
            database or the app's Redis cannot be reached.
    """
    config = config or load_config()
    found = checks.problems(config)
    if found:
        raise ConfigurationError("\n".join(found))
    app = Flask("api")
    app.config["SECRET_KEY"] = config.SECRET_KEY
    app.config["APP_CONFIG"] = config
    app.session_interface = _NoSessions()
    if config.RESPECT_XFORWARD_HEADERS_ENABLED:
        # Dify's setting: one proxy in front, whose view of the client (its address above all) is the truth.
        from werkzeug.middleware.proxy_fix import ProxyFix

        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1, x_proto=1, x_host=1, x_port=1)  # type: ignore[method-assign]

    from api.extensions import (
        ext_celery,
        ext_database,
        ext_durable_stream,
        ext_event_bus,
        ext_redis,
    )

    ext_database.init_app(app, config)
    ext_redis.init_app(app, config)
    check_redis_reachable(config)
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
    from api.extensions import ext_metrics

    ext_metrics.count_requests(app)
    from api.commands import register_commands

    register_commands(app)
    return app


def check_redis_reachable(config: AppConfig) -> None:
    """The app's Redis (and the event bus's, if it is another) answers, if one is configured.

    Raises:
        ConfigurationError: One does not answer within 5 s.
    """
    from api.configs import resolve
    from api.extensions.ext_redis import check_reachable

    checked = []
    for found in (resolve.main_redis(config), resolve.event_bus_redis(config)):
        if found is not None and found[0] not in checked:
            check_reachable(*found)
            checked.append(found[0])


class _NoSessions(SessionInterface):
    """The API keeps no cookie session (its clients prove themselves with a key or a passport on every
    request). Flask's default builds a signing serializer for every request to look for a cookie
    nobody sets: in a herd of arrivals, 6% of the worker's CPU."""

    def open_session(self, app: Flask, request: Any) -> None:
        return None  # Flask then gives the request its null session

    def save_session(self, app: Flask, session: Any, response: Any) -> None:
        return None
