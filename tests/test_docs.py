"""The adapter pages in ``docs/adapters/`` are generated from the adapters' docstrings: never stale."""

from __future__ import annotations

import pytest

from api.core.durable_stream.adapters import ADAPTERS
from tools import gen_adapter_docs


def test_the_generator_covers_every_adapter() -> None:
    assert gen_adapter_docs.ADAPTERS == ADAPTERS


@pytest.mark.parametrize("name", ADAPTERS)
def test_the_adapter_page_is_generated_from_its_docstring(name: str) -> None:
    page = gen_adapter_docs.page_path(name)
    assert page.exists(), f"{page} is missing: run `make docs`"
    assert page.read_text(encoding="utf-8") == gen_adapter_docs.render(name), f"{page} is stale: run `make docs`"
