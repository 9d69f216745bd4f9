"""WSGI entry point: ``gunicorn -k gevent api.app:app``."""

from __future__ import annotations

from api.app_factory import create_app
from api.extensions import ext_logging, ext_metrics

app = create_app()
ext_logging.init_app(app, app.config["APP_CONFIG"])
ext_metrics.require_serving(app.config["APP_CONFIG"])
ext_metrics.start(app.config["APP_CONFIG"], "api")
