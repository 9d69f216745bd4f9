"""gunicorn's logger, with access lines that compute only the atoms their format names.

gunicorn's own ``Logger.access`` builds every atom for every request before formatting the line: the
time in Apache's format (a ``strftime`` with the zone), a dict of every request and response header
and environ entry, then a quoted copy of all of it. A run's end ends all its SSE clients' requests
at once, and at 10,000 clients gunicorn's access lines took 18% of the worker's CPU while the runs
streamed and ended (``docs/benchmarks.md``, "Ending responses off the delivery path").
:class:`AccessLogger` computes each atom when the format asks for it, with gunicorn's meanings and
quoting; anything else is answered by gunicorn's own atoms, built once for that line. A line of
``api.gunicorn_conf``'s six atoms: 40 µs with gunicorn's logger, 18 µs with this one.

Used through ``logger_class`` in ``api.gunicorn_conf``; the format is still ``access_log_format``.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

from gunicorn import glogging


class LazyAtoms(Mapping[str, Any]):
    """One access line's atoms, each computed when the format looks it up.

    An atom gunicorn does not define reads ``-``, and a ``"`` in a text atom is escaped, as with
    gunicorn's ``SafeAtoms``.
    """

    __slots__ = ("_full", "_logger", "environ", "req", "request_time", "resp")

    resp: Any
    req: Any
    environ: dict[str, Any]
    request_time: timedelta

    def __init__(
        self, logger: glogging.Logger, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta
    ) -> None:
        self._logger = logger
        self.resp, self.req, self.environ, self.request_time = resp, req, environ, request_time
        self._full: Mapping[str, Any] | None = None

    def __getitem__(self, key: str) -> Any:
        compute = _ATOMS.get(key)
        if compute is None:  # the time, the user, a header or environ entry: gunicorn's own atoms
            if self._full is None:
                full = self._logger.atoms(self.resp, self.req, self.environ, self.request_time)
                self._full = self._logger.atoms_wrapper_class(full)
            return self._full[key]
        value = compute(self)
        return value.replace('"', '\\"') if isinstance(value, str) else value

    def __iter__(self) -> Iterator[str]:  # the cheap atoms only; logging's ``%`` formatting never iterates
        return iter(_ATOMS)

    def __len__(self) -> int:
        # Never 0: logging takes a single non-empty mapping argument as the format's mapping.
        return len(_ATOMS)


def _status(atoms: LazyAtoms) -> Any:
    status = atoms.resp.status
    return status.split(None, 1)[0] if isinstance(status, str) else status


def _sent(atoms: LazyAtoms) -> Any:
    return getattr(atoms.resp, "sent", None)


def _request_line(atoms: LazyAtoms) -> str:
    environ = atoms.environ
    path, query = redacted_path(environ.get("PATH_INFO") or ""), environ.get("QUERY_STRING")
    target = f"{path}?{redacted_query(query)}" if query else path
    return f"{environ['REQUEST_METHOD']} {target} {environ['SERVER_PROTOCOL']}"


#: gunicorn's atoms that cost next to nothing, as ``gunicorn.glogging.Logger.atoms`` defines them.
_ATOMS: dict[str, Callable[[LazyAtoms], Any]] = {
    "h": lambda atoms: atoms.environ.get("REMOTE_ADDR", "-"),
    "l": lambda atoms: "-",
    "r": _request_line,
    "s": _status,
    "m": lambda atoms: atoms.environ.get("REQUEST_METHOD"),
    "U": lambda atoms: redacted_path(atoms.environ.get("PATH_INFO") or ""),
    "q": lambda atoms: redacted_query(atoms.environ.get("QUERY_STRING") or ""),
    "H": lambda atoms: atoms.environ.get("SERVER_PROTOCOL"),
    "b": lambda atoms: "-" if (sent := _sent(atoms)) is None else str(sent),
    "B": _sent,
    "f": lambda atoms: atoms.environ.get("HTTP_REFERER", "-"),
    "a": lambda atoms: atoms.environ.get("HTTP_USER_AGENT", "-"),
    "T": lambda atoms: atoms.request_time.seconds,
    "D": lambda atoms: atoms.request_time.seconds * 1_000_000 + atoms.request_time.microseconds,
    "M": lambda atoms: atoms.request_time.seconds * 1000 + int(atoms.request_time.microseconds / 1000),
    "L": lambda atoms: f"{atoms.request_time.seconds}.{atoms.request_time.microseconds:06d}",
    "p": lambda atoms: f"<{os.getpid()}>",
}


class AccessLogger(glogging.Logger):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's logger. With ``LOG_FORMAT=json`` (the default) its error and access lines are JSON objects
    like the app's, an access line's fields (remote, method, path, status, bytes, duration_ms, query) each a
    field of its own, with the query's values and a form's token redacted; in text, its access lines
    compute only the atoms their format names (and the path's form token is redacted too)."""

    _json = False

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        self._json = os.environ.get("LOG_FORMAT", "json") == "json"
        if not self._json:
            return
        from api.extensions.ext_logging import JsonFormatter

        for handler in [*self.error_log.handlers, *self.access_log.handlers]:
            handler.setFormatter(JsonFormatter())

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: timedelta) -> None:
        if not self.access_log_enabled:
            return
        try:
            atoms = LazyAtoms(self, resp, req, environ, request_time)
            if self._json:  # the line as its format says, and its fields as fields of their own
                extra = access_fields(resp, environ, request_time)
                self.access_log.info(self.cfg.access_log_format, atoms, extra=extra)
            else:
                self.access_log.info(self.cfg.access_log_format, atoms)
        except Exception:  # as gunicorn does: a broken format must not fail the request
            self.error(traceback.format_exc())


#: A form's token is a bearer capability: whoever has it may answer the form. It never goes to a log.
_FORM_TOKEN = re.compile(r"(/form/human_input/)[^/?]+")
REDACTED = "[redacted]"


def redacted_path(path: str) -> str:
    return _FORM_TOKEN.sub(rf"\g<1>{REDACTED}", path)


def redacted_query(query: str) -> str:
    """The query's names, each value redacted (``user=…&last_event_id=…`` carry identities and resume tokens)."""
    names = [part.split("=", 1)[0] for part in query.split("&") if part]
    return "&".join(f"{name}={REDACTED}" for name in names)


def access_fields(resp: Any, environ: dict[str, Any], request_time: timedelta) -> dict[str, Any]:
    """An access line's fields, each a field of the JSON line: no header, no query value, no form token."""
    status = resp.status
    fields: dict[str, Any] = {
        "remote": environ.get("REMOTE_ADDR", "-"),
        "method": environ.get("REQUEST_METHOD"),
        "path": redacted_path(environ.get("PATH_INFO") or ""),
        "status": int(status.split(None, 1)[0]) if isinstance(status, str) else status,
        "bytes": getattr(resp, "sent", None),
        "duration_ms": round(request_time.total_seconds() * 1000, 3),
    }
    query = environ.get("QUERY_STRING")
    if query:
        fields["query"] = redacted_query(query)
    return fields
