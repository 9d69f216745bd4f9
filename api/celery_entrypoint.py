"""Celery entry point: ``celery -A api.celery_entrypoint:celery worker``.

Every worker started from here also runs the reaper (see ``api.tasks.reaper``), beats its heartbeat
(``api.tasks.heartbeat``) and, with
``WORKER_METRICS_BIND`` set, serves its Prometheus metrics (``api.extensions.ext_metrics``). A worker
whose settings cannot serve refuses to start with one line per problem (``api.startup``).
"""

from __future__ import annotations

from api.app_factory import create_app
from api.extensions import ext_logging, ext_metrics
from api.startup import serving_app
from api.tasks import heartbeat, reaper

flask_app = serving_app("worker", create_app)
ext_logging.init_app(flask_app, flask_app.config["APP_CONFIG"])
celery = flask_app.extensions["celery"]
reaper.init_worker(flask_app)
heartbeat.init_worker(flask_app)
ext_metrics.init_worker(flask_app.config["APP_CONFIG"])
