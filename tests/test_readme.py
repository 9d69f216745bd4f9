"""The README fits on a screen or two, its curl walk runs as written, and no link in it or in docs/ is dead."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest
import requests

from harness.app_env import base_env
from harness.processes import BIN, ROOT, process_env
from harness.served_stack import ServedStack

README = ROOT / "README.md"
#: Markdown files whose relative links must resolve (the SDK's README keeps its own, checked here too).
PAGES = [README, ROOT / "CHANGELOG.md", ROOT / "sdk" / "python" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(match) for match in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_readme_fits_on_a_screen_or_two_and_starts_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail to docs/"
    first = "\n".join(lines[:20])
    assert re.search(r"^make run\b", first, flags=re.M) and re.search(r"^make test\b", first, flags=re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: pathlib.Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        missing_anchor = anchor and resolved.suffix == ".md" and resolved.exists() and anchor not in _anchors(resolved)
        if not resolved.exists() or missing_anchor:
            dead.append(target)
    # Pages named in code spans (`docs/x.md`) as well.
    dead += [name for name in re.findall(r"`(docs/[\w./-]+\.md)`", text) if not (ROOT / name).exists()]
    assert not dead, f"{page.relative_to(ROOT)}: dead links {dead}"


def _walk() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    (walk,) = [block for block in blocks if "Last-Event-ID" in block]
    return walk


def _data_lines(sse: str) -> list[str]:
    return [line for line in sse.splitlines() if line.startswith("data: ")]


def test_the_readme_walk_streams_drops_and_resumes_exactly(tmp_path: pathlib.Path) -> None:
    """The walk, run by bash against gunicorn and Celery: what it read before hanging up and after
    resuming is the whole run as stored, each event once, in order."""
    var = tmp_path / "var"
    env = base_env(var, WORKFLOW_LLM_TOKEN_DELAY="0.005")
    with ServedStack(env, var, servers=1, workers_per_server=1) as stack:
        # As written, but against this test's server, from a scratch directory, with this checkout's tools.
        walk = (
            _walk()
            .replace("http://127.0.0.1:5001", stack.urls[0])
            .replace(".venv/bin/", f"{BIN}/")
            .replace("examples/", f"{ROOT / 'examples'}/")
        )
        work = tmp_path / "walk"
        work.mkdir()
        shell_env = process_env(env)
        done = subprocess.run(
            ["bash", "-euc", walk], cwd=work, env=shell_env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr

        first = (work / "first.txt").read_text()
        rest = (work / "rest.txt").read_text()
        run_id = re.search(r"(?im)^x-workflow-run-id: (\S+)", (work / "headers.txt").read_text())
        assert run_id is not None
        whole = requests.get(
            f"{stack.urls[0]}/v1/workflow/{run_id.group(1)}/events",
            params={"user": "me", "include_state_snapshot": "true"},
            headers={"Authorization": f"Bearer {_only_key(stack)}"},
            timeout=30,
        )
        assert whole.status_code == 200
        stored = _data_lines(whole.text)
    assert first.startswith("event: ping") and len(_data_lines(first)) == 2
    assert _data_lines(first) + _data_lines(rest) == stored
    assert '"event":"workflow_finished"' in stored[-1]
    # What the walk prints: the first two events, then how many the resumed stream carried.
    assert done.stdout == f"{first}{len(_data_lines(rest))}\n"


def _only_key(stack: ServedStack) -> str:
    """The API key of the one app the walk created."""
    from sqlalchemy import select

    from api.models import App
    from api.models.engine import db

    with stack.app.app_context():
        try:
            (key,) = db.session.execute(select(App.api_key)).scalars().all()
            return str(key)
        finally:
            db.session.remove()
