"""Log lines: JSON objects, one per line (``LOG_FORMAT=json``, the default), or plain text.

Every line carries ``ts``, ``level``, ``logger`` and ``message``, an ``exc`` with the traceback when
there is one, and the run's ``app_id``, ``task_id``, ``workflow_run_id`` and ``transport`` when it is
about a run (see :mod:`api.libs.log_context`). The handler goes on the root logger, so Celery's and
gunicorn's own lines (``worker_hijack_root_logger`` is off) come out the same way. What the app
logs is ids, statuses and errors: never an event payload, an input, an API key or a resume token.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from flask import Flask

from api.configs import AppConfig
from api.libs.log_context import RUN_FIELDS, RunFieldsFilter

__all__ = ["CeleryTaskFields", "JsonFormatter", "TextFormatter", "init_app", "unraisable"]

_MARK = "_api_log_handler"


#: What every LogRecord has: anything else on a record came as ``extra=`` fields (or from a filter).
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
_SCALARS = (str, int, float, bool)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, then the record's own fields
    (the run's ids, an access line's method and status, ``extra=`` of any call) as fields of their own,
    and ``exc`` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            # Plain values only: a library's structured extra (Celery's ``data`` holds a task's arguments,
            # a form's answer among them) is no field of ours, and never a log's business.
            if name not in _RECORD_ATTRIBUTES and not name.startswith("_") and isinstance(value, _SCALARS):
                line.setdefault(name, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{name}={getattr(record, name)}" for name in RUN_FIELDS if hasattr(record, name))
        return f"{text} [{fields}]" if fields else text


#: Celery's loggers whose lines are about one task (received, succeeded, failed, retried).
_CELERY_TASK_LOGGERS = ("celery.app.trace", "celery.worker.strategy", "celery.worker.request")
_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class CeleryTaskFields(logging.Filter):
    """Celery's own lines about a workflow task carry the run's ids too: its task id is the run's
    ``task_id`` (``api.services.task_queue``), and the run's id is the task's first argument."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in _CELERY_TASK_LOGGERS and isinstance(record.args, Mapping):
            task_id = record.args.get("id")
            if isinstance(task_id, str) and getattr(record, "task_id", None) is None:
                record.task_id = task_id
            found = _RUN_ID.search(str(record.args.get("args", "")))
            if found and getattr(record, "workflow_run_id", None) is None:
                record.workflow_run_id = found.group(0)
        return True


def unraisable(info: Any, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
    """``sys.unraisablehook``: an exception nobody could catch (a ``__del__``, a weakref callback) is one log
    record, not a plain-text traceback on stderr. One raised while the interpreter is finalizing is dropped:
    the modules it needs are being torn down (a gevent worker's locks, at every exit), and it says nothing
    about the app. (``_finalizing`` is bound at import: by then this module's globals may be gone.)"""
    if _finalizing():
        return
    where = f" in {info.object!r}" if info.object is not None else ""
    logging.getLogger("api.unraisable").error(
        "an exception could not be raised%s: %s",
        where,
        info.err_msg or "",
        exc_info=(info.exc_type, info.exc_value, info.exc_traceback),
    )


def init_app(app: Flask, config: AppConfig) -> None:
    """One handler on the root logger (replacing the one an earlier app of this process installed)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    setattr(handler, _MARK, True)
    handler.setFormatter(JsonFormatter() if config.LOG_FORMAT == "json" else TextFormatter())
    handler.addFilter(RunFieldsFilter())
    handler.addFilter(CeleryTaskFields())
    root.addHandler(handler)
    logging.captureWarnings(True)  # Python's warnings (a library's, Celery's) as log records too
    sys.unraisablehook = unraisable
    logging.getLogger("api").setLevel(config.LOG_LEVEL.upper())
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
