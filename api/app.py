"""WSGI entry point: ``gunicorn -k gevent api.app:app``.

A process whose settings cannot serve refuses to start with one line per problem (``api.startup``).
"""

from __future__ import annotations

from flask import Flask

from api.app_factory import create_app
from api.configs import AppConfig
from api.extensions import ext_logging, ext_metrics
from api.startup import serving_app


def _build(config: AppConfig) -> Flask:
    app = create_app(config)
    ext_logging.init_app(app, config)
    ext_metrics.require_serving(config)
    ext_metrics.start(config, "api")
    return app


app = serving_app("api", _build)
