"""Celery's filesystem broker for the embedded profile, without kombu's read race.

kombu's filesystem transport publishes a message by creating its file and then writing it, under an
``flock`` that its consumers never take: a consumer that lists the folder between the two moves the
empty file away, fails to parse it, and the message is gone (with the worker's consumer crashing on
the error). It also claims a message by ``shutil.move`` into the system's temporary folder, which is a
copy and a delete when that is another filesystem, so two consumers could both take one message.

Here a message is written whole to a hidden temporary file in the queue's folder and published by an
atomic rename; a consumer claims it by an atomic rename into the processed folder (on the same
filesystem: only one consumer's rename can succeed), so every message is read whole by exactly one
consumer. A file that still cannot be parsed is set aside in ``corrupt/`` with a warning instead of
stopping the worker, and a broker folder that was moved or deleted is created again.

What it still does not have is an acknowledgement that survives the consumer: a worker killed while
holding a message it fetched (prefetched, or running) loses it. The task outbox
(``api.services.task_queue``) covers that: a message whose attempt no worker claimed is sent again.
:data:`ALIAS` makes ``filesystem://`` this transport in every process that configures Celery here.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import uuid
from collections.abc import Callable
from queue import Empty
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils import json as kombu_json

__all__ = ["ALIAS", "Channel", "Transport", "install", "probe"]

logger = logging.getLogger(__name__)

#: The URL scheme this transport answers to.
ALIAS = "filesystem"
_PATH = f"{__name__}:Transport"


def install() -> None:
    """Make ``filesystem://`` mean this transport in this process (before any connection is made).

    Celery reads ``CELERY_BROKER_URL`` from the environment itself, so the scheme is what selects the
    transport; kombu resolves it through its alias table.
    """
    TRANSPORT_ALIASES[ALIAS] = _PATH


#: kombu's JSON (it also encodes the types its other transports' messages may carry), as the stock one writes.
_dumps: Callable[[Any], str] = kombu_json.dumps
_loads: Callable[[bytes], Any] = kombu_json.loads


def _is_message(name: str, queue: str) -> bool:
    return not name.startswith(".") and name.partition(".")[2] == f"{queue}.msg"


class Channel(filesystem.Channel):
    """kombu's filesystem channel with atomic publication and claims."""

    def _folder(self, path: str) -> pathlib.Path:
        folder = pathlib.Path(path)
        folder.mkdir(parents=True, exist_ok=True)  # moved or deleted since: messages in it are the outbox's
        return folder

    # kombu's filesystem channel and its abstract base name this parameter differently; ours is theirs.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        folder = self._folder(self.data_folder_out)
        name = f"{round(monotonic() * 1000):015d}_{uuid.uuid4()}.{queue}.msg"  # sorted: oldest first
        temporary = folder / f".{name}.tmp"
        try:
            with open(temporary, "wb") as file:
                file.write(_dumps(payload).encode())
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, folder / name)  # consumers see the whole message, or none of it
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise ChannelError(f"cannot add a message to queue {queue!r}") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        inbox = self._folder(self.data_folder_in)
        claimed = self._folder(self.processed_folder)
        for name in sorted(os.listdir(inbox)):
            if not _is_message(name, queue):
                continue
            taken = claimed / f"{name}.{uuid.uuid4().hex}"
            try:
                os.rename(inbox / name, taken)  # atomic: only one consumer's rename finds the file
            except OSError:
                continue  # another consumer took it
            try:
                message = _loads(taken.read_bytes())
            except (OSError, ValueError) as exc:
                self._set_aside(taken, exc)
                continue
            if not self.store_processed:
                taken.unlink(missing_ok=True)
            return message
        raise Empty()

    def _set_aside(self, path: pathlib.Path, error: Exception) -> None:
        corrupt = self._folder(str(pathlib.Path(self.processed_folder).parent / "corrupt"))
        logger.warning("filesystem broker: message %s cannot be read (%s); set aside in %s", path.name, error, corrupt)
        try:
            os.replace(path, corrupt / path.name)
        except OSError:
            path.unlink(missing_ok=True)

    def _size(self, queue: str) -> int:
        return sum(1 for name in os.listdir(self._folder(self.data_folder_in)) if _is_message(name, queue))

    def _purge(self, queue: str) -> int:
        inbox = self._folder(self.data_folder_in)
        count = 0
        for name in os.listdir(inbox):
            if _is_message(name, queue):
                try:
                    os.remove(inbox / name)
                    count += 1
                except OSError:
                    pass  # taken by a consumer meanwhile
        return count

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self._folder(str(self.control_folder))
        super()._queue_bind(exchange, routing_key, pattern, queue)  # type: ignore[no-untyped-call]


#: The longest a worker's wait for messages lasts before it looks again for a shutdown (Celery's loop for
#: a polled broker asks for 2 s, which every warm shutdown, e.g. ``make run``'s Ctrl-C, waited out).
DRAIN_WAIT = 0.25


class Transport(filesystem.Transport):
    Channel = Channel

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        wait = timeout if timeout is None else min(timeout, DRAIN_WAIT)
        return super().drain_events(connection, timeout=wait, **kwargs)  # type: ignore[no-untyped-call]


def probe(folder: pathlib.Path) -> None:
    """Write, publish, read back and remove a file in the broker's queue folder: what a message needs.

    Raises:
        OSError: The folder cannot take a message (missing and not creatable, read-only, full).
        ValueError: What was read back is not what was written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    name = f".probe-{uuid.uuid4().hex}"
    temporary, published = folder / f"{name}.tmp", folder / name
    body = json.dumps({"probe": name}).encode()
    try:
        with open(temporary, "wb") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, published)
        if published.read_bytes() != body:
            raise ValueError("the broker folder returned another message than it was given")
    finally:
        temporary.unlink(missing_ok=True)
        published.unlink(missing_ok=True)
