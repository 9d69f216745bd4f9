"""The README's library example runs as written (against a temporary SQLite file)."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_library_example_runs(tmp_path: pathlib.Path) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "the README lost its library example"
    code = blocks[0].replace("sqlite:///var/streams.db", f"sqlite:///{tmp_path / 'streams.db'}")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, "README.md", "exec"), {})
    assert output.getvalue().splitlines() == ['b\'{"event": "text_chunk", "data": {"text": "Hi"}}\'']
