"""Human-input form rows: opened by the worker at a pause, answered or expired by whoever comes first.

Like ``run_store``, every transition is one conditional ``UPDATE`` in a short transaction of its own,
whose row count says who won: a form is submitted once, expires once, and never both.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Update, insert, select, update

from api.models import HumanInputForm, HumanInputFormStatus
from api.models.engine import db

WAITING = HumanInputFormStatus.WAITING.value


def _execute(statement: Update) -> int:
    with db.engine.begin() as connection:
        return int(connection.execute(statement).rowcount)


def open_form(app_id: str, run_id: str, form: Mapping[str, Any]) -> None:
    """Store a paused node's form (the ``human_input_required`` data), answerable by its token from now on."""
    with db.engine.begin() as connection:
        connection.execute(
            insert(HumanInputForm).values(
                id=form["form_id"],
                token=form["form_token"],
                app_id=app_id,
                run_id=run_id,
                node_id=form["node_id"],
                status=WAITING,
                definition_json=json.dumps(form),
                expires_at=float(form["expiration_time"]),
                created_at=datetime.datetime.now(datetime.UTC),
            )
        )


def _answer(form_id: str, status: HumanInputFormStatus, *conditions: Any, action_id: str | None = None) -> Update:
    return (
        update(HumanInputForm)
        .where(HumanInputForm.id == form_id, HumanInputForm.status == WAITING, *conditions)
        .values(status=status.value, action_id=action_id, answered_at=datetime.datetime.now(datetime.UTC))
    )


def submit_statement(form_id: str, action_id: str) -> Update:
    """Take a waiting form's answer (only one submission wins, and none after it expired): for the
    transaction that resumes its run with it (``run_store.resume``)."""
    return _answer(
        form_id, HumanInputFormStatus.SUBMITTED, HumanInputForm.expires_at > time.time(), action_id=action_id
    )


def expire_statement(form_id: str) -> Update:
    """End a waiting form whose time is up: for the transaction that resumes its run with the timeout."""
    return _answer(form_id, HumanInputFormStatus.EXPIRED, HumanInputForm.expires_at <= time.time())


def expire(form_id: str) -> bool:
    """End a waiting form whose time is up, whose run is not paused (nothing to resume)."""
    return _execute(expire_statement(form_id)) == 1


def close(form_id: str) -> bool:
    """End a waiting form whose run ended another way (stopped) or could not be resumed."""
    return _execute(_answer(form_id, HumanInputFormStatus.CLOSED)) == 1


def close_run_forms_statement(run_id: str) -> Update:
    return (
        update(HumanInputForm)
        .where(HumanInputForm.run_id == run_id, HumanInputForm.status == WAITING)
        .values(status=HumanInputFormStatus.CLOSED.value, answered_at=datetime.datetime.now(datetime.UTC))
    )


def close_run_forms(run_id: str) -> None:
    _execute(close_run_forms_statement(run_id))


def overdue(limit: int = 100) -> list[tuple[str, str]]:
    """``(form id, run id)`` of waiting forms whose time is up, oldest first."""
    query = (
        select(HumanInputForm.id, HumanInputForm.run_id)
        .where(HumanInputForm.status == WAITING, HumanInputForm.expires_at <= time.time())
        .order_by(HumanInputForm.expires_at)
        .limit(limit)
    )
    with db.engine.connect() as connection:
        return [(row[0], row[1]) for row in connection.execute(query)]
