"""Which run a log line is about: ``app_id``, ``task_id``, ``workflow_run_id`` and ``transport`` on every line.

Code that works on a run binds its fields once (:func:`bound`: the worker's attempt, an event
stream, a reaper's check); :class:`RunFieldsFilter` adds them to every record logged meanwhile in
that thread or greenlet. A line logged elsewhere about a run (a watchdog timer, a lease thread, the
run watcher, a request's refusal) names the run id among its arguments: the filter finds the fields
by that id, of a run bound now or of one of the runs this process built the fields of lately
(:func:`fields_of` remembers them); a line of the house form ``"run %s: …"`` about a run it knows
nothing of still gets its ``workflow_run_id``. Fields passed as ``extra=`` win.

Lines never carry payloads, inputs, outputs or credentials: the fields are ids and a transport name.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator, Mapping

__all__ = ["RUN_FIELDS", "RunFieldsFilter", "bound", "fields_of"]

#: The fields every line about a run carries.
RUN_FIELDS = ("app_id", "task_id", "workflow_run_id", "transport")

_current: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("run_log_fields", default=None)
#: Fields of the runs bound in this process right now, by run id (for lines logged outside the binding).
_by_run: dict[str, Mapping[str, str]] = {}
#: Fields of the runs whose fields this process built lately, oldest first (at most :data:`REMEMBERED`).
_recent: dict[str, Mapping[str, str]] = {}
REMEMBERED = 10_000


def fields_of(*, app_id: str, task_id: str, workflow_run_id: str, transport: str) -> dict[str, str]:
    """A run's fields, remembered for the lines about it logged outside a binding."""
    fields = {"app_id": app_id, "task_id": task_id, "workflow_run_id": workflow_run_id, "transport": transport}
    _recent.pop(workflow_run_id, None)
    _recent[workflow_run_id] = fields
    if len(_recent) > REMEMBERED:
        with contextlib.suppress(StopIteration, RuntimeError, KeyError):  # another thread evicted it first
            del _recent[next(iter(_recent))]
    return fields


@contextlib.contextmanager
def bound(fields: Mapping[str, str]) -> Iterator[None]:
    """Log ``fields`` on every line of this thread or greenlet until the block ends."""
    token = _current.set(fields)
    run_id = fields["workflow_run_id"]
    _by_run[run_id] = fields
    try:
        yield
    finally:
        _by_run.pop(run_id, None)
        try:
            _current.reset(token)
        except ValueError:  # a generator closed from another context: that context's value is not ours
            _current.set(None)


class RunFieldsFilter(logging.Filter):
    """Adds the run's fields to a record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "workflow_run_id", None) is not None:
            return True
        fields = _current.get()
        if fields is None and record.args:
            arguments = record.args.values() if isinstance(record.args, Mapping) else record.args
            ids = [arg for arg in arguments if isinstance(arg, str)]
            fields = next((known[arg] for known in (_by_run, _recent) for arg in ids if arg in known), None)
            if fields is None and ids and isinstance(record.msg, str) and record.msg.startswith("run %s"):
                fields = {"workflow_run_id": ids[0]}
        if fields is not None:
            for name, value in fields.items():
                setattr(record, name, value)
        return True
