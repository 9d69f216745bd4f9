"""Celery entry point: ``celery -A api.celery_entrypoint:celery worker``."""

from __future__ import annotations

from api.app_factory import create_app

flask_app = create_app()
celery = flask_app.extensions["celery"]
