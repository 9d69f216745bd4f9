"""Reading a Celery broker from outside: which runs' task messages wait in the queue, and how many
messages workers hold unacknowledged (started or prefetched).

Celery's message protocol 2: a message's ``body`` is base64 of JSON ``[args, kwargs, embed]``; the
workflow tasks take the run id as their first argument.
"""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Mapping
from typing import Any

import redis


def _run_id(message: Mapping[str, Any]) -> str | None:
    try:
        args = json.loads(base64.b64decode(message["body"]))[0]
    except (KeyError, ValueError, TypeError, IndexError):
        return None
    return str(args[0]) if args else None


def queued_run_ids(env: Mapping[str, str]) -> set[str]:
    """The runs whose task message still waits in the queue (no worker has fetched it)."""
    queue = env["CELERY_QUEUE"]
    found: set[str] = set()
    if env["CELERY_BROKER_URL"].startswith("filesystem"):
        folder = pathlib.Path(env["VAR_DIR"]) / "broker" / "queue"
        for path in folder.glob(f"*.{queue}.msg"):
            try:
                run_id = _run_id(json.loads(path.read_bytes()))
            except (OSError, ValueError):  # taken by a worker while we looked
                continue
            if run_id:
                found.add(run_id)
        return found
    client = redis.Redis.from_url(env["CELERY_BROKER_URL"])
    try:
        for raw in client.lrange(queue, 0, -1):
            run_id = _run_id(json.loads(raw))
            if run_id:
                found.add(run_id)
    finally:
        client.close()
    return found


def unacked(env: Mapping[str, str]) -> int:
    """Messages fetched by workers and not acknowledged yet (Redis broker only)."""
    client = redis.Redis.from_url(env["CELERY_BROKER_URL"])
    try:
        return int(client.hlen("unacked"))
    finally:
        client.close()
