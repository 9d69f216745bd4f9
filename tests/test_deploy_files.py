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
