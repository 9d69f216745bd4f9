"""WSGI entry point: ``gunicorn -k gevent api.app:app``."""

from __future__ import annotations

from api.app_factory import create_app
from api.extensions import ext_metrics

app = create_app()
ext_metrics.start(app.config["APP_CONFIG"], "api")
