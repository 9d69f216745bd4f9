"""WSGI entry point: ``gunicorn -k gevent api.app:app``."""

from __future__ import annotations

from api.app_factory import create_app

app = create_app()
