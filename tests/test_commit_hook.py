"""The repository's commit-msg hook (tools/git-hooks, installed by ``make install``) keeps subjects short."""

from __future__ import annotations

import pathlib
import subprocess

from harness.processes import ROOT

HOOK = ROOT / "tools" / "git-hooks" / "commit-msg"


def _check(tmp_path: pathlib.Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True, check=False)


def test_a_subject_of_72_characters_passes_and_73_is_refused(tmp_path: pathlib.Path) -> None:
    assert _check(tmp_path, "s" * 72 + "\n\n" + "a body line may be as long as it needs to be " * 5).returncode == 0
    refused = _check(tmp_path, "s" * 73 + "\n")
    assert refused.returncode == 1 and "73 characters" in refused.stderr
