"""The Python client examples of docs/clients.md and the SDK's README run as written against the real stack."""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

from durable_workflow_client import Client, WorkflowFinished

from harness.processes import ROOT
from tests.sdk.conftest import Sdk


def test_the_clients_page_example_runs(sdk: Sdk) -> None:
    page = (ROOT / "docs" / "clients.md").read_text()
    section = page.split("## Python", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", section.split("## CLI", 1)[0], flags=re.S)
    code = code.replace("http://127.0.0.1:5001", sdk.stack.urls[0]).replace("app-...", sdk.keys["greeting"])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, "docs/clients.md", "exec"), {})
    greeting = "Hello Ada! It is a wonderful day to build durable streams together."
    # The formal draft streams nothing before the pause (it reaches no end node, as in Dify).
    assert output.getvalue().splitlines() == [
        "paused; the token to resume from: True",
        f"succeeded {greeting} (approved: true)",
    ]


def test_the_client_readme_examples_run(sdk: Sdk) -> None:
    readme = (ROOT / "sdk" / "python" / "README.md").read_text()
    streaming, forms = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    streaming = streaming.replace("http://127.0.0.1:5001", sdk.stack.urls[0]).replace("app-…", sdk.keys["greeting"])
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(streaming, "sdk/python/README.md", "exec"), {})
    assert output.getvalue().splitlines()[-1].split()[0] == "succeeded"

    with Client(sdk.stack.urls[0], sdk.keys["greeting"]) as client:
        scope: dict[str, Any] = {"client": client}
        exec(compile(forms, "sdk/python/README.md", "exec"), scope)
        assert scope["fields"] == [("approved", "select"), ("note", "paragraph")]
        assert isinstance(scope["event"], WorkflowFinished) and scope["event"].status == "succeeded"
