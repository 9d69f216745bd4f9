"""The Durable Streams gateway on its own: ``gunicorn -k gevent api.durable_streams_app:app``.

Serves the protocol at ``/`` over ``DURABLE_STREAM_URL`` (the same settings as the API; the app
database is used only to check API keys and find workflow runs). The API itself can mount the same
blueprint under ``DURABLE_STREAMS_GATEWAY_PREFIX`` instead.
"""

from __future__ import annotations

from flask import Flask

from api.configs import AppConfig, ConfigurationError, checks, load_config


def create_gateway_app(config: AppConfig | None = None) -> Flask:
    """Raises:
    ConfigurationError: ``config`` cannot serve the gateway, or its database cannot be reached."""
    config = config or load_config()
    found = checks.problems(config, gateway=True)
    if found:
        raise ConfigurationError("\n".join(found))
    app = Flask("durable_streams_gateway")
    app.config["SECRET_KEY"] = config.SECRET_KEY
    app.config["APP_CONFIG"] = config

    from api.controllers.durable_streams import create_blueprint
    from api.extensions import ext_database, ext_durable_stream

    ext_database.init_app(app, config)
    ext_durable_stream.init_app(app, config)
    app.register_blueprint(create_blueprint(""))
    return app


def _build(config: AppConfig) -> Flask:
    from api.extensions import ext_logging, ext_metrics

    app = create_gateway_app(config)
    ext_logging.init_app(app, config)
    ext_metrics.require_serving(config)
    ext_metrics.start(config, "api")
    return app


_served: list[Flask] = []


def __getattr__(name: str) -> Flask:
    """``app`` is built on first use (``gunicorn api.durable_streams_app:app``), not on import: importing
    :func:`create_gateway_app` must not build, or refuse, an app from the environment."""
    if name != "app":
        raise AttributeError(name)
    if not _served:
        from api.startup import serving_app

        _served.append(serving_app("gateway", _build))
    return _served[0]
