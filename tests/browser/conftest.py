"""A real headless Chromium (Debian's ``chromium`` package) driven by Playwright for Python.

Playwright's own browser download cannot run here, so the system Chromium is launched by path; the
project installs it (``make chromium``, ``.ci/run``). A page's uncaught errors fail its test.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from sqlalchemy import func, select

from api.core.app.apps.event_codec import unstamped
from api.core.app.apps.topics import workflow_run_topic
from api.core.durable_stream import CLOSED
from api.extensions.ext_durable_stream import durable_stream
from api.models import WorkflowRun
from api.models.engine import db
from api.services.delivery import current_runtime
from harness.served_stack import ServedStack

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Per module, so that Playwright's event loop is gone before any other test module runs.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium package")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


def stored_events(stack: ServedStack, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The run's sealed topic as (cursor, event), read from the beginning by the test process."""
    with stack.app.app_context():
        events = []
        with durable_stream().topic(workflow_run_topic("workflow", run_id)).subscribe_from_beginning() as subscription:
            while (record := subscription.receive(timeout=5)) is not CLOSED:
                assert record is not None, f"the topic of run {run_id} was never sealed"
                events.append((str(record.cursor), json.loads(unstamped(record.payload))))
        return events


def open_tokens(stack: ServedStack, run_id: str, tokens: list[str]) -> list[str]:
    """The cursors sealed in resume tokens the browser received (each must be this run's and user's)."""
    row = stack.run_row(run_id)
    assert row is not None
    topic = workflow_run_topic("workflow", run_id)
    with stack.app.app_context():
        codec = current_runtime().tokens
        return [codec.open(token, topic=topic, app_id=row["app_id"], end_user=row["end_user"]) for token in tokens]


def trim_topic(stack: ServedStack, run_id: str, keep_last: int) -> None:
    with stack.app.app_context():
        durable_stream().admin.trim_topic(workflow_run_topic("workflow", run_id), keep_last)


def runs_with_input(stack: ServedStack, user: str, marker: str) -> int:
    """How many runs of ``user`` hold ``marker`` (a value unique to one test) in their inputs."""
    query = select(func.count()).where(WorkflowRun.end_user == user, WorkflowRun.inputs_json.contains(marker))
    with stack.app.app_context():
        try:
            count: int = db.session.execute(query).scalar_one()
            return count
        finally:
            db.session.remove()
