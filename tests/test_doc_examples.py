"""The library example in docs/library.md runs as written (against a temporary SQLite file)."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

from harness.processes import ROOT


def test_the_library_example_runs(tmp_path: pathlib.Path) -> None:
    page = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks, "docs/library.md lost its example"
    code = blocks[0].replace("sqlite:///var/streams.db", f"sqlite:///{tmp_path / 'streams.db'}")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, "docs/library.md", "exec"), {})
    assert output.getvalue().splitlines() == ['b\'{"event": "text_chunk", "data": {"text": "Hi"}}\'']
