"""``Idempotency-Key`` on starting a run: a client whose POST was cut may retry it without a second run.

A key is scoped to the app and the end user and kept ``IDEMPOTENCY_KEY_TTL`` seconds (a day at
least). The run and its key are committed together, and the key is unique in its scope, so of two
requests with the same key exactly one creates the run; the other (and every later retry) gets
that run. The body's fingerprint guards against a key reused for another request.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from flask import current_app
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from api.configs import AppConfig
from api.libs.errors import InvalidParamError, UnprocessableError
from api.models import App, IdempotencyKey, WorkflowRun
from api.models.engine import db

from . import workflow_run_service as runs

HEADER = "Idempotency-Key"
#: Sent with the answer to a retried request: the run it names was started by an earlier one.
REPLAYED_HEADER = "Idempotent-Replayed"
_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def _ttl() -> float:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config.IDEMPOTENCY_KEY_TTL


def parse_key(value: str | None) -> str | None:
    """The request's key, or ``None`` without one.

    Raises:
        InvalidParamError: (400) not 1 to 255 visible ASCII characters.
    """
    if value is None:
        return None
    if _KEY.fullmatch(value) is None:
        raise InvalidParamError(f"the {HEADER} header must be 1 to 255 visible ASCII characters")
    return value


def fingerprint(body: Any) -> str:
    """SHA-256 of the body's canonical JSON (keys sorted): the same request, however it is spelled."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def create_run_once(
    app: App, inputs: dict[str, Any], user: str, key: str, body_fingerprint: str
) -> tuple[WorkflowRun, bool]:
    """The run of ``key``: created now (``False``), or the one an earlier request created (``True``).

    Raises:
        UnprocessableError: (422 ``idempotency_key_reused``) the key was used with another body.
    """
    earlier = _run_of(app, user, key, body_fingerprint)
    if earlier is not None:
        return earlier, True
    cutoff = time.time() - _ttl()
    # A key older than its time may be used again: its row would hold the scope's unique slot.
    db.session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.app_id == app.id,
            IdempotencyKey.end_user == user,
            IdempotencyKey.key == key,
            IdempotencyKey.created_at <= cutoff,
        )
    )
    run = runs.new_run(app, inputs, user)
    db.session.flush()  # the run's id
    db.session.add(
        IdempotencyKey(
            app_id=app.id, end_user=user, key=key, fingerprint=body_fingerprint, run_id=run.id, created_at=time.time()
        )
    )
    try:
        db.session.commit()
    except IntegrityError:  # a concurrent request with the same key won
        db.session.rollback()
        earlier = _run_of(app, user, key, body_fingerprint)
        if earlier is None:
            raise
        return earlier, True
    return run, False


def _run_of(app: App, user: str, key: str, body_fingerprint: str) -> WorkflowRun | None:
    row = db.session.execute(
        select(IdempotencyKey).where(
            IdempotencyKey.app_id == app.id,
            IdempotencyKey.end_user == user,
            IdempotencyKey.key == key,
            IdempotencyKey.created_at > time.time() - _ttl(),
        )
    ).scalar_one_or_none()
    if row is None:
        return None
    if row.fingerprint != body_fingerprint:
        raise UnprocessableError(
            f"this {HEADER} was used with another request body; use a new key for a new run",
            code="idempotency_key_reused",
        )
    return db.session.get(WorkflowRun, row.run_id)


def purge_expired() -> int:
    """Forget keys older than their time (the reaper's sweep); returns how many."""
    with db.engine.begin() as connection:
        result = connection.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at <= time.time() - _ttl()))
        return int(result.rowcount)
