"""docker-compose.yaml cannot run here (no Docker engine); keep it consistent with the settings."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from api.configs import AppConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_compose_uses_only_known_settings_and_real_entry_points() -> None:
    text = (ROOT / "docker" / "docker-compose.yaml").read_text()
    block = text.split("x-app-env: &app-env", 1)[1].split("\n\n", 1)[0]
    names = re.findall(r"^\s+([A-Z_]+):", block, flags=re.M)
    assert names and set(names) <= set(AppConfig.model_fields), set(names) - set(AppConfig.model_fields)
    assert "api.app:app" in text and "api.celery_entrypoint:celery" in text
    assert (ROOT / "api" / "app.py").exists() and (ROOT / "api" / "celery_entrypoint.py").exists()


def test_bin_run_and_compose_use_the_gunicorn_config() -> None:
    # api/gunicorn_conf.py sets worker_connections from WEB_WORKER_CONNECTIONS and freezes the GC.
    for path in (ROOT / "bin" / "run", ROOT / "docker" / "docker-compose.yaml"):
        text = path.read_text()
        assert "python:api.gunicorn_conf" in text and "WEB_WORKER_CONNECTIONS" in text, path
    import api.gunicorn_conf as conf

    assert conf.worker_connections >= 10000 and callable(conf.post_worker_init)


def test_the_worker_hook_freezes_the_gc_and_stops_tracking_greenlet_trees() -> None:
    # In a child: gc.freeze() and gevent's config are process-wide.
    script = """
import gc, logging, types
import gevent
import api.gunicorn_conf as conf
assert gevent.config.track_greenlet_tree
conf.post_worker_init(types.SimpleNamespace(log=logging.getLogger("worker")))
assert not gevent.config.track_greenlet_tree
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
"""
    env = {key: value for key, value in os.environ.items() if key != "GEVENT_TRACK_GREENLET_TREE"}
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, env=env, timeout=60)
