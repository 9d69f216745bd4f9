"""Celery, configured from the app settings; every task runs inside a Flask app context."""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from flask import Flask

from api.configs import AppConfig

from . import filesystem_broker

# ``filesystem://`` is our transport without kombu's read race, in every process that configures Celery.
filesystem_broker.install()


def init_app(app: Flask, config: AppConfig) -> Celery:
    """Raises:
    ConfigurationError: No broker is set outside development (``api.configs.resolve.broker``)."""

    class FlaskTask(Task):  # type: ignore[misc]
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with app.app_context():
                return self.run(*args, **kwargs)

    broker = config.broker_url()
    celery_app = Celery(app.name, task_cls=FlaskTask)
    settings: dict[str, Any] = {
        # The filesystem broker has no host; naming the one kombu would fall back to keeps it from
        # warning about it on every start.
        "broker_url": "filesystem://localhost//" if broker == "filesystem://" else broker,
        "task_default_queue": config.CELERY_QUEUE,
        "task_ignore_result": True,
        # At least once: a message leaves the broker only when its attempt is over, and a worker
        # that dies with messages in hand gives them back. A delivery runs only if it claims its
        # attempt (api.core.app.apps.workflow_app_runner), so a second delivery runs nothing twice.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": config.CELERY_PREFETCH_MULTIPLIER,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
    }
    if broker.startswith(("redis", "rediss", "sentinel")):
        settings["broker_transport_options"] = {
            # Messages a dead worker held come back after this long; a live worker's long attempt
            # may be delivered again too, and that delivery finds the attempt claimed.
            "visibility_timeout": config.CELERY_VISIBILITY_TIMEOUT,
            "unacked_restore_interval": max(1, min(10, int(config.CELERY_VISIBILITY_TIMEOUT / 4))),
            "unacked_restore_throttle": 1,
            # Dify's CELERY_USE_SENTINEL: the sentinels of CELERY_BROKER_URL name the primary.
            **config.broker_transport_options(),
        }
        ssl_options = config.broker_ssl_options()
        if ssl_options is not None:
            settings["broker_use_ssl"] = ssl_options
    if broker.startswith("filesystem"):
        folder = config.broker_folder()
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        settings["broker_transport_options"] = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": 0.1,
        }
    settings["beat_schedule"] = beat_schedule(config)
    # Beat's record of when each entry last ran, with the app's other files rather than in the cwd.
    settings["beat_schedule_filename"] = str(config.VAR_DIR / "celerybeat-schedule")
    config.VAR_DIR.mkdir(parents=True, exist_ok=True)
    celery_app.conf.update(settings)
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    return celery_app


def beat_schedule(config: AppConfig) -> dict[str, dict[str, Any]]:
    """What ``celery beat`` sends: a reaper sweep and a retention sweep, each on its own interval (0: never).

    Each entry expires after its own interval: a sweep no worker took in time is dropped, not piled up.
    """
    schedule: dict[str, dict[str, Any]] = {}
    if config.BEAT_REAPER_INTERVAL > 0:
        schedule["reap-expired-workflow-runs"] = {
            "task": "reap_expired_workflow_runs",
            "schedule": config.BEAT_REAPER_INTERVAL,
            "options": {"expires": config.BEAT_REAPER_INTERVAL},
        }
    if config.BEAT_RETENTION_INTERVAL > 0 and config.WORKFLOW_EVENT_TRANSPORT == "durable_stream":
        schedule["enforce-stream-retention"] = {
            "task": "enforce_stream_retention",
            "schedule": config.BEAT_RETENTION_INTERVAL,
            "options": {"expires": config.BEAT_RETENTION_INTERVAL},
        }
    return schedule
