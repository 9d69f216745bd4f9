"""The README's Python client example runs as written against the real stack."""

from __future__ import annotations

import contextlib
import io
import re

from harness.processes import ROOT
from tests.sdk.conftest import Sdk


def test_the_readme_client_example_runs(sdk: Sdk) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Clients", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("### CLI", 1)[0], flags=re.S)
    code = code.replace("http://127.0.0.1:5001", sdk.stack.urls[0]).replace("app-...", sdk.keys["greeting"])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, "README.md", "exec"), {})
    greeting = "Hello Ada! It is a wonderful day to build durable streams together."
    assert output.getvalue().splitlines() == [
        greeting,
        "paused; the token to resume from: True",
        f"succeeded {greeting} (approved: true)",
    ]
