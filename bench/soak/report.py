"""What a scenario hands back: a markdown table, the settings it ran with, and what went wrong."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
from typing import Any

from bench.common import cpu_model

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"


@dataclasses.dataclass
class Table:
    scenario: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = dataclasses.field(default_factory=list)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: Broken invariants (a run that never ended, a lost event, a skip, a 5xx…); empty when all held.
    problems: list[str] = dataclasses.field(default_factory=list)
    #: Raw figures for the JSON results, per row.
    data: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def add(self, row: dict[str, Any]) -> None:
        """A row given by column name; every column must be present."""
        self.rows.append([row[column] for column in self.columns])
        self.data.append(row)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.settings:
            lines += ["Settings: " + ", ".join(f"`{key}={value}`" for key, value in self.settings.items()), ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" if index == 0 else "---:" for index in range(len(self.columns))) + "|")
        lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in self.rows]
        lines += ["", *[f"- {note}" for note in self.notes]] if self.notes else []
        if self.problems:
            lines += ["", "**Problems:**", *[f"- {problem}" for problem in self.problems[:20]]]
            if len(self.problems) > 20:
                lines.append(f"- … and {len(self.problems) - 20} more (see the JSON results)")
        return "\n".join(lines) + "\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "settings": self.settings,
            "rows": self.data,
            "notes": self.notes,
            "problems": self.problems,
            "seconds": round(self.seconds, 1),
        }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def machine() -> dict[str, Any]:
    cpu = cpu_model()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "redis_server": _version(["redis-server", "--version"]),
        "postgresql": _version([str(_pg_bin() / "postgres"), "--version"]),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _pg_bin() -> pathlib.Path:
    from harness.postgres_server import PG_BIN

    return PG_BIN


def _version(command: list[str]) -> str:
    if shutil.which(command[0]) is None and not pathlib.Path(command[0]).exists():
        return "not installed"
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except OSError as exc:
        return f"unknown ({exc})"


def write_results(results: dict[str, Any], suffix: str = "") -> pathlib.Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"soak-{datetime.date.today().isoformat()}{suffix}.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return path
