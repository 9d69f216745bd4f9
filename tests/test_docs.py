"""The adapter pages in ``docs/adapters/`` are generated from the adapters' docstrings, and
``docs/configuration.md`` from the settings models: never stale."""

from __future__ import annotations

import pytest

from api.configs import AppConfig
from api.core.durable_stream.adapters import ADAPTERS
from tools import gen_adapter_docs, gen_config_docs


def test_the_generator_covers_every_adapter() -> None:
    assert gen_adapter_docs.ADAPTERS == ADAPTERS


@pytest.mark.parametrize("name", ADAPTERS)
def test_the_adapter_page_is_generated_from_its_docstring(name: str) -> None:
    page = gen_adapter_docs.page_path(name)
    assert page.exists(), f"{page} is missing: run `make docs`"
    assert page.read_text(encoding="utf-8") == gen_adapter_docs.render(name), f"{page} is stale: run `make docs`"


def test_the_configuration_page_is_generated_from_the_settings() -> None:
    page = gen_config_docs.PAGE
    assert page.exists(), f"{page} is missing: run `make docs`"
    assert page.read_text(encoding="utf-8") == gen_config_docs.render(), f"{page} is stale: run `make docs`"


def test_the_configuration_page_lists_every_setting_and_its_dify_name() -> None:
    text = gen_config_docs.render()
    for name in AppConfig.model_fields:
        assert f"| `{name}`" in text, name
    for dify in ("REDIS_SENTINELS", "EVENT_BUS_REDIS_URL", "DB_HOST", "CELERY_USE_SENTINEL", "DEPLOY_ENV"):
        assert f"`{dify}`" in text, dify
    assert "| `BROADCAST_CHANNEL_TYPE` (also `EVENT_BUS_REDIS_CHANNEL_TYPE`, `PUBSUB_REDIS_CHANNEL_TYPE`) |" in text
