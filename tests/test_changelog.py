"""CHANGELOG.md keeps its rules: one line per change, at most 120 characters, each ending with its issue,
internal changes in one line per release, and no change listed in two releases."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from harness.processes import ROOT

CHANGELOG = ROOT / "CHANGELOG.md"
RELEASE = re.compile(r"^## \[(Unreleased|\d+\.\d+\.\d+)\](?: - \d{4}-\d{2}-\d{2})?$")
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
ISSUES = re.compile(r" \((#\d+)(, #\d+)*\)$")
LIMIT = 120


def _releases(text: str) -> dict[str, list[str]]:
    """Each release's lines, from its heading to the next one (the preamble above the first is not one)."""
    releases: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            match = RELEASE.match(line)
            assert match, f"not a release heading: {line!r}"
            assert match.group(1) not in releases, f"{match.group(1)} appears twice"
            current = releases[match.group(1)] = []
        elif current is not None:
            current.append(line)
    return releases


def _entries(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("- ")]


def _text(entry: str) -> str:
    """What an entry says, without its issue link."""
    return ISSUES.sub("", entry[2:]).strip().lower()


RELEASES = _releases(CHANGELOG.read_text(encoding="utf-8"))


def test_unreleased_comes_first_then_releases_newest_first() -> None:
    names = list(RELEASES)
    assert names[0] == "Unreleased"
    versions = [tuple(int(part) for part in name.split(".")) for name in names[1:]]
    assert versions == sorted(versions, reverse=True)


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_change_is_one_short_line_that_links_its_issue(release: str) -> None:
    lines = RELEASES[release]
    started = False
    for line in lines:
        if line.startswith("### "):
            assert line[4:] in SECTIONS, f"{release}: unknown section {line!r}"
            started = True
        elif started and line.strip():
            # Inside the sections every line is an entry: no wrapped continuation lines, no prose.
            assert line.startswith("- "), f"{release}: not a one-line entry: {line!r}"
            assert len(line) <= LIMIT, f"{release}: {len(line)} characters (at most {LIMIT}): {line}"
            assert ISSUES.search(line), f"{release}: no issue link such as (#28) at the end: {line}"
    assert started, f"{release} has no section"


@pytest.mark.parametrize("release", list(RELEASES))
def test_internal_changes_are_one_line_per_release(release: str) -> None:
    internal = [entry for entry in _entries(RELEASES[release]) if entry.startswith("- Internal:")]
    assert len(internal) <= 1, internal


def test_no_change_is_listed_twice() -> None:
    seen = Counter(_text(entry) for lines in RELEASES.values() for entry in _entries(lines))
    assert not [text for text, count in seen.items() if count > 1]
