"""Container healthchecks (``docker/docker-compose.yaml``), with nothing but the standard library.

``python -m api.healthcheck http URL``: healthy when URL answers at all below 500 (the API answers
an unauthenticated request with 401 or 404; a worker's metrics listener with 200).
``python -m api.healthcheck fresh PATH SECONDS``: healthy when a file whose name starts with PATH
was written within SECONDS (celery beat rewrites its schedule file as it runs).
"""

from __future__ import annotations

import pathlib
import sys
import time
import urllib.error
import urllib.request


def http_ok(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status) < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


def fresh(prefix: str, seconds: float) -> bool:
    path = pathlib.Path(prefix)
    candidates = list(path.parent.glob(path.name + "*")) if path.parent.is_dir() else []
    return any(time.time() - candidate.stat().st_mtime <= seconds for candidate in candidates)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "http":
        return 0 if http_ok(argv[1]) else 1
    if len(argv) == 3 and argv[0] == "fresh":
        return 0 if fresh(argv[1], float(argv[2])) else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
