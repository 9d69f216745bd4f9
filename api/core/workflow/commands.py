"""graphon's command channel for a run: how a stop reaches the engine and its model.

On the Redis profile a stop is an ``AbortCommand`` on graphon's own Redis channel (the mechanism Dify
uses), sent by the API that takes the stop; on the embedded profile the run's stop flag in the database,
which the worker's coordinator polls, is turned into the same command by the engine. Either way the
command is seen twice: by graphon's dispatcher, which stops scheduling nodes, and by the run's
:class:`StopSignal`, which the model checks between chunks (the dispatcher looks only between nodes).
"""

from __future__ import annotations

import threading
from typing import Any

from graphon.engine.command import CommandChannel, RedisChannel
from graphon.engine.command.builtin.in_memory import InMemoryChannel
from graphon.engine.command.entities import AbortCommand, Command

from .model_runtime import StopSignal

#: How long an unread command stays in Redis (a run's attempt reads it within its stop check).
COMMAND_TTL = 3600


def command_key(run_id: str) -> str:
    return f"workflow:{run_id}:commands"


def redis_channel(client: Any, run_id: str) -> CommandChannel:
    """graphon's Redis channel of run ``run_id`` (``client``: a redis-py client)."""
    return RedisChannel(client, command_key(run_id), command_ttl=COMMAND_TTL)


def send_abort(client: Any, run_id: str, reason: str) -> None:
    """Ask the worker executing run ``run_id`` to stop it, through graphon's Redis channel."""
    redis_channel(client, run_id).send_command(AbortCommand(reason=reason))


class StopChannel:
    """Wraps a run's channel: an abort read from it, by graphon's dispatcher or by the engine's own poll
    between events, sets the run's stop signal at once; graphon still gets every command."""

    def __init__(self, inner: CommandChannel | None, signal: StopSignal) -> None:
        self._inner: CommandChannel = inner if inner is not None else InMemoryChannel()
        self._signal = signal
        self._lock = threading.Lock()
        self._held: list[Command] = []

    def _take(self) -> list[Command]:
        commands = self._inner.fetch_commands()
        for command in commands:
            if isinstance(command, AbortCommand):
                self._signal.set(command.reason or "stopped")
        return commands

    def poll(self) -> None:
        """Read the channel now (the engine does between events), keeping what it read for graphon."""
        with self._lock:
            self._held.extend(self._take())

    def fetch_commands(self) -> list[Command]:
        with self._lock:
            commands, self._held = [*self._held, *self._take()], []
        return commands

    def send_command(self, command: Command) -> None:
        self._inner.send_command(command)
