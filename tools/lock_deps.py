"""``requirements.lock``: the exact versions of the app's runtime dependencies, for the image and for CI.

The app's ``pyproject.toml`` says what it needs (``>=``); the lock says what was tested: every
distribution its runtime dependencies pull in, with the version installed in this environment,
walked from ``[project].dependencies`` (their extras and markers evaluated here: Linux, this
Python), plus the packages of ``requirements-nodeps.txt`` (graphon), which are installed without their
declared dependencies and so are pinned alone. Nothing is fetched from a registry. The image installs
the lock, then the app without dependencies; ``make install`` installs the development environment
constrained by it.

    python -m tools.lock_deps          # write the lock (``make lock``)
    python -m tools.lock_deps --check  # exit 1 if the lock is not what this environment has
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tomllib
from collections import deque
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
NODEPS = ROOT / "requirements-nodeps.txt"
HEADER = """\
# The app's runtime dependencies, each at the version its tests ran with (python -m tools.lock_deps;
# `make lock`). Installed by docker/Dockerfile and, as constraints, by `make install`. Do not edit by hand.
"""


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"]]


def nodeps_requirements() -> list[Requirement]:
    """The exact pins installed with ``--no-deps`` (their own dependencies are not walked)."""
    lines = (line.split("#", 1)[0].strip() for line in NODEPS.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def resolve(requirements: list[Requirement]) -> dict[str, str]:
    """Every distribution ``requirements`` need here, by canonical name, with its installed version.

    Raises:
        metadata.PackageNotFoundError: One of them is not installed (run ``make install`` first).
    """
    environment: dict[str, str] = dict(default_environment())
    found: dict[str, str] = {}
    extras_seen: set[tuple[str, str]] = set()
    queue: deque[tuple[Requirement, str]] = deque((requirement, "") for requirement in requirements)
    while queue:
        requirement, extra = queue.popleft()
        if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        distribution = metadata.distribution(name)
        first_time = name not in found
        found[name] = distribution.version
        wanted = [("", first_time)] + [(wish, (name, wish) not in extras_seen) for wish in requirement.extras]
        for wish, new in wanted:
            if not new:
                continue
            extras_seen.add((name, wish))
            for text in distribution.requires or []:
                queue.append((Requirement(text), wish))
    return found


def render() -> str:
    pins = resolve(runtime_requirements())
    for requirement in nodeps_requirements():
        pins[canonicalize_name(requirement.name)] = metadata.version(requirement.name)
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lock_deps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report a lock that differs (exit status 1)")
    options = parser.parse_args(argv)
    text = render()
    if options.check:
        if not LOCK.exists() or LOCK.read_text() != text:
            print(f"{LOCK.name} is not what this environment has: run `make lock`", file=sys.stderr)
            return 1
        return 0
    LOCK.write_text(text)
    print(f"wrote {LOCK.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
