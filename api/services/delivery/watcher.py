"""The run's row as the read side sees it: checked when a client arrives, watched while it is streamed.

The read side's one owner of run recovery. Every check a reader makes of its run's row is here:

- **on arrival** (:func:`checked_run`): the run of this app and user, after the reaper's checks (an
  expired lease or a missed start fails the run and writes its end; a pending end is written);
- **while streaming** (:class:`RunWatcher`): one watcher per process for the runs its event streams
  read, checked in batches, not per stream (below);
- **what the row says** for a stream: the run's end built from its row (:func:`final_event`), whether
  the run has left a pause a reader is about to end at (:func:`left_pause`, the stale-pause rule's
  question), whether a finished run's events vanished rather than aged out (:func:`events_lost`),
  and the row as it is now (:func:`latest`).

An event stream must not wait forever for a run whose worker died, whose end is pending, or whose
end a live-only transport will never deliver again. Each stream used to check its run's row on its
own every few seconds while idle, which woke every idle stream every second and cost one query per
stream per check. Instead, each open stream registers here (:meth:`RunWatcher.watch`), and one
thread (a greenlet under gevent) checks, once per ``interval``, every run with at least one open
stream in this process with one query, applies the same checks as the reaper
(:func:`~api.services.run_recovery.check_run`: an expired lease or a missed start fails the run
and writes its end, a pending end is written), and ends only the streams whose run needs it:

- on a live-only transport, every stream of a run whose row is terminal (its end was published
  while nobody listened, or is about to be; the row says how it ended);
- otherwise the streams of a terminal run whose end is still not in the topic ``grace`` after
  this watcher first saw it pending (its finisher's retries are over; the row says how it ended).

A stream is ended by closing its subscription after leaving the run's ``workflow_finished`` (built
from the row) in its :class:`StreamWatch`; the stream's loop finds it there and sends it as its last
event. A run whose end reaches the topic needs nothing: its streams read it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from flask import Flask, current_app
from sqlalchemy import select

from api.core.app.apps.event_transport import EventSubscription
from api.models import App, WorkflowRun, WorkflowRunStatus
from api.models.engine import db

from .. import run_recovery
from .. import workflow_run_service as runs

logger = logging.getLogger(__name__)

__all__ = [
    "RunWatcher",
    "StreamWatch",
    "checked_run",
    "events_lost",
    "final_event",
    "latest",
    "left_pause",
    "repair_lost_end",
    "run_watcher",
]

#: Runs one query reads.
_CHUNK = 500


def checked_run(app: App, run_or_task_id: str, user: str) -> WorkflowRun:
    """The run of ``app`` and ``user`` named by its id or its task's, after the reaper's checks.

    Raises:
        NotFoundError: (404) no such run of this app and user.
    """
    return runs.checked(app, runs.get_run_by_task(app, run_or_task_id, user, or_run_id=True))


def repair_lost_end(app: App, run: WorkflowRun) -> bool:
    """Before a reader waits on a finished run: an end (or seal) the stream store lost in a failover is
    written again (``run_recovery.repair_lost_end``); whether it was. Never raises."""
    return run_recovery.repair_lost_end(app, run)


def final_event(run: WorkflowRun) -> dict[str, Any]:
    """The ``workflow_finished`` of a terminal run, built from its row."""
    return run_recovery.finished_event_of(run)


def latest(run_id: str) -> WorkflowRun | None:
    """The run's row as it is now (not what this session loaded before)."""
    run = db.session.get(WorkflowRun, run_id, populate_existing=True)
    db.session.commit()  # end the read transaction: the next look must see a fresh row
    return run


def left_pause(run_id: str, payload: bytes) -> bool:
    """Whether the run has left the pause ``payload`` announced: its row is no longer paused, or paused
    at another form (a later pause). A form answered a moment ago resumes the run before its worker
    writes anything, and a reader replaying the run must not end at the pause it left."""
    with db.engine.connect() as connection:
        row = connection.execute(
            select(WorkflowRun.status, WorkflowRun.state_json).where(WorkflowRun.id == run_id)
        ).first()
    if row is None:
        return False
    status, state_json = row
    if status != WorkflowRunStatus.PAUSED.value:
        return True
    try:
        reasons = json.loads(payload)["data"].get("reasons") or []
        announced = reasons[0]["form_id"] if reasons else None
        current = (json.loads(state_json or "{}").get("form") or {}).get("form_id")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return announced is not None and current is not None and announced != current


def events_lost(run: WorkflowRun, max_age: float | None) -> bool:
    """Whether a finished run's events vanished rather than aged out: it stored some (it knows their
    topic's incarnation) and retention (``max_age`` seconds, or none) could not have removed them yet."""
    if run.stream_epoch is None:
        return False
    finished = run.finished_timestamp or run.created_timestamp
    return max_age is None or time.time() - finished < max_age


class StreamWatch:
    """One open stream of a run, as the watcher sees it."""

    __slots__ = ("drained", "final", "live_only", "revoked", "run_id", "subscription")

    def __init__(self, run_id: str, subscription: EventSubscription, live_only: bool) -> None:
        self.run_id = run_id
        self.subscription = subscription
        self.live_only = live_only
        self.final: dict[str, Any] | None = None
        #: Set when the process drains: the stream ends with a ``retry:`` instead of an event.
        self.drained = False
        #: Set when the credential the stream was opened with is revoked: it ends with an ``error``.
        self.revoked = False

    def final_event(self) -> dict[str, Any] | None:
        """The event the watcher ended the stream with, if it did."""
        return self.final

    def end(self, final: dict[str, Any]) -> None:
        self.final = final
        self.subscription.close()  # wakes the stream, which then sends ``final``

    def drain(self) -> None:
        self.drained = True
        self.subscription.close()  # wakes the stream, which then tells its client to come back

    def revoke(self) -> None:
        self.revoked = True
        self.subscription.close()  # wakes the stream, which then tells its client why it ends


class RunWatcher:
    """The runs read by this process's open streams, checked together once per ``interval``."""

    def __init__(self, app: Flask, *, interval: float, grace: float) -> None:
        self._app = app
        self._interval, self._grace = interval, grace
        self._lock = threading.Lock()
        self._streams: dict[str, set[StreamWatch]] = {}
        self._pending_since: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._draining = False

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def draining(self) -> bool:
        """Whether the process is going away: every stream, and every later one, ends with a ``retry:``."""
        return self._draining

    def watch(self, run_id: str, subscription: EventSubscription, *, live_only: bool) -> StreamWatch:
        """Watch ``run_id`` for one more stream (reading ``subscription``) until :meth:`unwatch`."""
        watch = StreamWatch(run_id, subscription, live_only)
        if self._draining:  # a request that began before the drain: it ends at once too
            watch.drain()
            return watch
        with self._lock:
            self._streams.setdefault(run_id, set()).add(watch)
            if self._thread is None or not self._thread.is_alive():  # none yet, stopped, or not forked
                self._thread = threading.Thread(target=self._run, name="run-watcher", daemon=True)
                self._thread.start()
        return watch

    def unwatch(self, watch: StreamWatch) -> None:
        with self._lock:
            streams = self._streams.get(watch.run_id)
            if streams is None:
                return
            streams.discard(watch)
            if not streams:
                del self._streams[watch.run_id]
                self._pending_since.pop(watch.run_id, None)

    def drain(self) -> int:
        """End every watched stream (each tells its client to come back), and every later one; returns how many."""
        with self._lock:
            self._draining = True
            watches = [watch for streams in self._streams.values() for watch in streams]
        for watch in watches:
            watch.drain()
        return len(watches)

    def watched(self) -> int:
        """How many runs are watched (for tests and diagnostics)."""
        with self._lock:
            return len(self._streams)

    def streams_of(self, run_id: str) -> int:
        """How many open streams of ``run_id`` are watched (for tests and diagnostics)."""
        with self._lock:
            return len(self._streams.get(run_id, ()))

    def _run(self) -> None:
        while True:
            time.sleep(self._interval)
            with self._lock:
                if not self._streams:
                    self._thread = None  # the next watch() starts another
                    return
            self.check()

    def check(self) -> None:
        """One pass over every watched run; never raises (the next pass tries again)."""
        with self._lock:
            run_ids = list(self._streams)
        with self._app.app_context():
            try:
                for start in range(0, len(run_ids), _CHUNK):
                    self._check(run_ids[start : start + _CHUNK])
            except Exception:  # the database is away: the streams go on, and the next pass tries again
                logger.warning("could not check the runs of open event streams", exc_info=True)
                db.session.rollback()
            finally:
                db.session.remove()

    def _check(self, run_ids: Sequence[str]) -> None:
        rows = db.session.execute(
            select(WorkflowRun, App).join(App, App.id == WorkflowRun.app_id).where(WorkflowRun.id.in_(run_ids))
        ).all()
        for run, app in rows:
            try:
                run_recovery.check_run(app, run)
                run_recovery.repair_lost_end(app, run)  # readers wait on it: an end the store lost comes back
            except Exception:  # one run's trouble must not stop the pass
                logger.warning("could not check run %s while streaming it", run.id, exc_info=True)
                db.session.rollback()
                continue
            self._settle(run, time.monotonic())
        db.session.commit()  # end the read transaction: the next pass must see fresh rows

    def _settle(self, run: WorkflowRun, now: float) -> None:
        """End the streams of ``run`` that will not get its end from the topic."""
        terminal = run.run_status.is_terminal
        with self._lock:
            watches = list(self._streams.get(run.id, ()))
            ending = [watch for watch in watches if watch.live_only] if terminal else []
            if not terminal or run.stream_ended or len(ending) == len(watches):
                self._pending_since.pop(run.id, None)
            elif now - self._pending_since.setdefault(run.id, now) >= self._grace:
                ending = watches
        if ending:
            final = final_event(run)
            for watch in ending:
                watch.end(final)


#: Where the process's :class:`~.runtime.DeliveryRuntime` puts its watcher in ``app.extensions``.
EXTENSION_KEY = "delivery.watcher"


def run_watcher() -> RunWatcher:
    """The watcher of the current app's process (built with its delivery runtime)."""
    watcher: RunWatcher = current_app.extensions[EXTENSION_KEY]
    return watcher
