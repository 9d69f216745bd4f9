"""docker-compose.yaml cannot run here (no Docker engine); keep it consistent with the settings."""

from __future__ import annotations

import pathlib
import re

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
