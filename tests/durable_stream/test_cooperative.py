"""The gevent side of :mod:`api.core.durable_stream._cooperative`, in a monkey-patched child process.

The test run itself is not patched, so the scenarios run as one script that patches first and
reports what it measured; the assertions are made here.
"""

from __future__ import annotations

import textwrap
import threading
import time

import pytest

from api.core.durable_stream.testing.helpers import blocked_in_wait
from harness.processes import run_script
from harness.waiting import wait_until

#: The time unit of the scenarios: the gaps between the deadlines they file, and the short waits. Long
#: enough that a busy machine's scheduling delays stay well inside one unit.
UNIT = 0.5

SCENARIOS = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, threading, time
    import gevent
    from api.core.durable_stream._cooperative import new_wake, run_blocking, HubWake

    UNIT = __UNIT__
    report = {"patched": monkey.is_module_patched("threading"), "kind": type(new_wake()).__name__}

    wake = new_wake()
    wake.set()
    report["set_before_wait"] = wake.wait(5.0)
    wake.clear()
    started = time.monotonic()
    report["timeout_result"] = wake.wait(UNIT)
    report["timeout_elapsed"] = time.monotonic() - started

    def set_later(delay, target):
        gevent.sleep(delay)
        target.set()

    woken = new_wake()
    gevent.spawn(set_later, UNIT / 10, woken)
    started = time.monotonic()
    report["greenlet_result"] = woken.wait(5.0)
    report["greenlet_elapsed"] = time.monotonic() - started

    # A greenlet that ticks while another waits: the wait must not block the hub.
    ticks = []
    ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.01)) for _ in range(10)])
    new_wake().wait(0.2)
    ticker.join()
    report["ticks_during_wait"] = len(ticks)

    # set() from a native OS thread (gevent's threadpool) must wake a waiting greenlet.
    native = new_wake()
    pool = gevent.get_hub().threadpool
    pool.spawn(lambda: (time.sleep(UNIT / 10), native.set()))
    started = time.monotonic()
    report["native_result"] = native.wait(5.0)
    report["native_elapsed"] = time.monotonic() - started

    # Many waiters, one set each, all woken.
    wakes = [new_wake() for _ in range(200)]
    results = []
    waiters = [gevent.spawn(lambda w: results.append(w.wait(5.0)), w) for w in wakes]
    gevent.sleep(0.01)
    for w in wakes:
        w.set()
    gevent.joinall(waiters, timeout=5)
    report["many_woken"] = sum(1 for r in results if r)

    # Deadlines filed out of order end each wait at its own; one ended early by set() disturbs nothing.
    ended = {}
    def timed(name, timeout, target):
        started = time.monotonic()
        target.wait(timeout)
        ended[name] = time.monotonic() - started
    early = new_wake()
    timed_waits = [
        gevent.spawn(timed, "late", 3 * UNIT, new_wake()),
        gevent.spawn(timed, "early", UNIT, early),
        gevent.spawn(timed, "first", UNIT, new_wake()),
        gevent.spawn(timed, "middle", 2 * UNIT, new_wake()),
    ]
    gevent.sleep(UNIT / 10)
    early.set()
    gevent.joinall(timed_waits, timeout=10 * UNIT)
    report["deadline_order"] = sorted(ended, key=ended.get)
    report["deadline_elapsed"] = ended

    # A long wait arms the hub's one timer for its deadline, not a tick every few milliseconds: the
    # loop sleeps through it (a prepare watcher counts its turns). When no wait is left, nothing
    # keeps the hub running.
    turns = [0]
    prepare = gevent.get_hub().loop.prepare()
    prepare.start(lambda: turns.__setitem__(0, turns[0] + 1))
    long_wake = new_wake()
    long_wait = gevent.spawn(long_wake.wait, 10.0)
    gevent.sleep(0.01)
    turns[0] = 0
    gevent.sleep(0.5)
    report["loop_turns_in_long_wait"] = turns[0]
    prepare.close()
    long_wake.set()
    long_wait.join()
    report["hub_can_exit"] = gevent.wait(timeout=2)

    # A killed waiter leaves nothing behind.
    lonely = new_wake()
    victim = gevent.spawn(lonely.wait, 5.0)
    gevent.sleep(0.01)
    victim.kill()
    report["waiters_after_kill"] = len(lonely._waiters)
    lonely.set()

    # An error raised in the threadpool reaches the caller as itself, and the hub prints nothing
    # (the test checks this process's stderr).
    class Expected(Exception):
        pass

    def fail():
        raise Expected("expected")

    try:
        run_blocking(fail)
    except Expected as exc:
        report["run_blocking_raised"] = str(exc)
    report["run_blocking_value"] = run_blocking(lambda: 42)
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def report() -> dict[str, object]:
    result, stderr = run_script(SCENARIOS.replace("__UNIT__", repr(UNIT)))
    result["stderr"] = stderr
    return result


def test_under_gevent_the_hub_wake_is_used(report: dict[str, object]) -> None:
    assert report["patched"] is True
    assert report["kind"] == "HubWake"


def test_a_set_wake_returns_at_once_and_an_unset_one_times_out(report: dict[str, object]) -> None:
    assert report["set_before_wait"] is True
    assert report["timeout_result"] is False
    # Its own deadline, not a much later one (the waits elsewhere in the scenarios are 5 s).
    assert 0.8 * UNIT <= float(report["timeout_elapsed"]) < 5 * UNIT  # type: ignore[arg-type]


def test_set_from_another_greenlet_wakes_the_waiter_without_blocking_the_hub(report: dict[str, object]) -> None:
    assert report["greenlet_result"] is True
    assert float(report["greenlet_elapsed"]) < 5.0 / 2  # woken by the set, not at the wait's 5 s
    assert report["ticks_during_wait"] == 10


def test_set_from_a_native_thread_wakes_the_waiter(report: dict[str, object]) -> None:
    assert report["native_result"] is True
    assert float(report["native_elapsed"]) < 5.0 / 2  # woken by the set, not at the wait's 5 s


def test_deadlines_end_each_wait_at_its_own_in_any_filing_order(report: dict[str, object]) -> None:
    assert report["deadline_order"] == ["early", "first", "middle", "late"]
    elapsed = report["deadline_elapsed"]
    assert isinstance(elapsed, dict)
    assert elapsed["early"] < UNIT  # set before its deadline
    # Each at its own deadline, before the next one's (they are a unit apart).
    for name, timeout in (("first", UNIT), ("middle", 2 * UNIT), ("late", 3 * UNIT)):
        assert timeout <= elapsed[name] < timeout + UNIT, (name, elapsed[name])


def test_a_long_wait_does_not_wake_the_hub_before_its_deadline(report: dict[str, object]) -> None:
    # A timer ticking every 5 ms would turn the loop about 100 times in those 0.5 s.
    assert report["loop_turns_in_long_wait"] < 10
    assert report["hub_can_exit"] is True


def test_every_waiter_is_woken_and_a_killed_one_is_forgotten(report: dict[str, object]) -> None:
    assert report["many_woken"] == 200
    assert report["waiters_after_kill"] == 0


def test_run_blocking_hands_errors_back_without_the_hub_printing_them(report: dict[str, object]) -> None:
    assert report["run_blocking_raised"] == "expected"
    assert report["run_blocking_value"] == 42
    assert "Traceback" not in str(report["stderr"]), report["stderr"]


def test_without_gevent_a_set_wake_returns_at_once_and_an_unset_one_times_out() -> None:
    from api.core.durable_stream._cooperative import new_wake

    wake = new_wake()
    assert type(wake).__name__ == "ThreadWake"
    started = time.monotonic()
    assert wake.wait(UNIT) is False
    assert 0.8 * UNIT <= time.monotonic() - started < 5 * UNIT
    wake.set()
    assert wake.is_set()
    started = time.monotonic()
    assert wake.wait(5.0) is True
    assert wake.wait(5.0) is True  # stays set until cleared
    assert time.monotonic() - started < 5.0 / 2  # returned at once, not at the 5 s timeout


def test_without_gevent_set_from_another_thread_wakes_the_waiter() -> None:
    from api.core.durable_stream._cooperative import new_wake

    wake = new_wake()
    results: list[tuple[bool, float]] = []

    def waiter() -> None:
        started = time.monotonic()
        results.append((wake.wait(10.0), time.monotonic() - started))

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: blocked_in_wait(thread), timeout=5, what="the waiter to block in wait()")
    wake.set()
    thread.join(5.0)
    assert results and results[0][0] is True and results[0][1] < 10.0 / 2, results


def test_without_gevent_a_wake_up_nobody_took_is_dropped_by_clear() -> None:
    from api.core.durable_stream._cooperative import new_wake

    wake = new_wake()
    wake.set()
    wake.set()  # twice: still one pending wake-up, and no error
    wake.clear()
    assert not wake.is_set()
    started = time.monotonic()
    assert wake.wait(0.05) is False  # not woken early by the dropped wake-up
    assert time.monotonic() - started >= 0.04
    wake.set()
    assert wake.wait(0) is True


def test_without_gevent_the_on_set_callback_runs_on_every_set_even_with_a_wake_up_pending() -> None:
    from api.core.durable_stream._cooperative import ThreadWake

    wake = ThreadWake()
    calls: list[bool] = []
    wake.on_set(lambda: calls.append(wake.is_set()))
    wake.set()
    # What a set() that raced the waiter's clear() leaves behind: the flag cleared, the lock still
    # released. A waiter blocked elsewhere (a subscription reading the Redis hints) never takes
    # that lock, so the next set() must still call it.
    wake._flag = False
    wake.set()
    assert calls == [True, True]
    wake.on_set(None)
    wake.set()
    assert calls == [True, True]
