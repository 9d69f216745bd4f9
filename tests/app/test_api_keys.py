"""API keys are resolved once per process for a few seconds: a herd of reconnecting clients of one app
sends the same key thousands of times a second. An app removed from the database is refused by every
process within ``KEY_CACHE_SECONDS``."""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import delete, inspect

from api.libs.errors import UnauthorizedError
from api.models import App
from api.models.engine import db
from api.services import app_service

pytestmark = pytest.mark.timeout(60)


def test_a_resolved_key_is_trusted_for_a_while_then_asked_again(
    make_harness: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = make_harness(start_worker=False)
    created = harness.create_app()
    with harness.app.app_context():
        first = app_service.authenticate(f"Bearer {created['api_key']}")
        assert first.id == created["app_id"]
        db.session.execute(delete(App).where(App.id == first.id))
        db.session.commit()
        db.session.remove()
        again = app_service.authenticate(f"Bearer {created['api_key']}")  # trusted, not asked
        assert again.id == first.id and inspect(again).transient  # a copy in no session
        later = time.monotonic() + app_service.KEY_CACHE_SECONDS + 1
        monkeypatch.setattr(app_service, "time", types.SimpleNamespace(monotonic=lambda: later))
        with pytest.raises(UnauthorizedError):
            app_service.authenticate(f"Bearer {created['api_key']}")
        with pytest.raises(UnauthorizedError):  # and again: only a resolved key is remembered
            app_service.authenticate(f"Bearer {created['api_key']}")
