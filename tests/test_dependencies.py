"""graphon's light install: pinned exactly, its light dependencies ours, its heavy ones an extra.

graphon declares the document extractor's parsers (unstructured, pandas, transformers: hundreds of MB) as
dependencies of the whole package. ``make install`` and the image install it without them
(``requirements-nodeps.txt``, ``--no-deps``); these tests keep that recipe honest: every dependency graphon
declares is either the app's own or in the ``documents`` extra, the environment holds no heavy one, and
every module of graphon but the document extractor imports in it.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: The one module that needs the extra.
NEEDS_DOCUMENTS = "graphon.nodes.document_extractor"


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(text).name) for text in requirements}


def _nodeps() -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in (ROOT / "requirements-nodeps.txt").read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def test_graphon_is_pinned_exactly_and_installed_at_the_pin() -> None:
    (graphon,) = _nodeps()
    assert graphon.name == "graphon"
    (specifier,) = graphon.specifier
    assert specifier.operator == "==", "graphon renames its API between minor versions: pin it exactly"
    assert metadata.version("graphon") == specifier.version
    locked = (ROOT / "requirements.lock").read_text().splitlines()
    assert f"graphon=={specifier.version}" in locked


def test_every_dependency_graphon_declares_is_ours_or_the_documents_extra() -> None:
    declared = _names([text for text in metadata.requires("graphon") or [] if "extra ==" not in text])
    light = _names(PYPROJECT["dependencies"])
    heavy = _names(PYPROJECT["optional-dependencies"]["documents"])
    assert declared <= light | heavy, f"graphon declares {sorted(declared - light - heavy)}: ours or the extra?"
    assert not (light & heavy)
    # The extra holds what graphon declares and nothing else.
    assert heavy <= declared
    assert "jinja2" in light, "graphon's template nodes need jinja2, which it does not declare"


def test_the_environment_has_none_of_the_heavy_dependencies() -> None:
    installed = {canonicalize_name(dist.metadata["Name"]) for dist in metadata.distributions()}
    for heavy in ("unstructured", "transformers", "pandas", "tiktoken", "pypdfium2"):
        assert heavy not in installed, f"{heavy} is installed: make install must install graphon with --no-deps"


def test_every_graphon_module_but_the_document_extractor_imports_without_the_extra() -> None:
    # A fresh interpreter: what this test process imported before proves nothing.
    script = """
import importlib, json, pkgutil, graphon
failed = {}
for module in pkgutil.walk_packages(graphon.__path__, "graphon."):
    try:
        importlib.import_module(module.name)
    except Exception as error:
        failed[module.name] = repr(error)
print(json.dumps(failed))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=True)
    failed = json.loads(done.stdout)
    assert set(failed) == {NEEDS_DOCUMENTS}, failed


def test_make_install_and_the_image_install_graphon_without_its_dependencies() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "--no-deps -c requirements.lock -r requirements-nodeps.txt" in makefile
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    # The lock names every distribution; --no-deps keeps pip from resolving graphon's heavy ones.
    assert "pip install --no-cache-dir --no-deps -r requirements.lock" in dockerfile
