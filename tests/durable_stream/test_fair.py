"""The FIFO-fair lock and semaphore of :mod:`api.core.durable_stream._fair`, in threads and under gevent.

The gevent scenarios run in a monkey-patched child process that reports what it measured; the
assertions are made here (the test run itself need not be patched).
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Callable

import pytest

from api.core.durable_stream._fair import FairLock, FairSemaphore
from harness.processes import run_script
from harness.waiting import wait_until


def _queued(semaphore: FairSemaphore, count: int) -> Callable[[], bool]:
    return lambda: len(semaphore._waiters) == count


def test_waiters_are_served_in_arrival_order() -> None:
    lock = FairLock()
    lock.acquire()
    order: list[int] = []

    def take(index: int) -> None:
        with lock:
            order.append(index)

    threads = []
    for index in range(6):
        thread = threading.Thread(target=take, args=(index,))
        thread.start()
        threads.append(thread)
        wait_until(_queued(lock, index + 1), timeout=5, what=f"waiter {index} to queue")
    lock.release()
    for thread in threads:
        thread.join(timeout=5)
    assert order == list(range(6))
    assert not lock.locked()


def test_a_releasing_holder_cannot_take_the_lock_back_past_a_waiter() -> None:
    lock = FairLock()
    lock.acquire()
    got_it = threading.Event()
    done = threading.Event()

    def wait_for_turn() -> None:
        with lock:
            got_it.set()
            done.wait(5)

    waiter = threading.Thread(target=wait_for_turn)
    waiter.start()
    wait_until(_queued(lock, 1), timeout=5, what="the waiter to queue")
    lock.release()
    assert not lock.acquire(blocking=False), "the releasing thread took the lock back"
    assert got_it.wait(5)
    done.set()
    waiter.join(5)
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_timed_out_waiter_leaves_the_queue() -> None:
    lock = FairLock()
    lock.acquire()
    results: list[tuple[bool, float]] = []

    def try_briefly() -> None:
        started = time.monotonic()
        results.append((lock.acquire(timeout=0.05), time.monotonic() - started))

    thread = threading.Thread(target=try_briefly)
    thread.start()
    thread.join(5)
    assert results and results[0][0] is False and 0.04 <= results[0][1] < 2.0, results
    assert not lock._waiters
    lock.release()
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_semaphore_counts_its_tokens_and_a_lock_refuses_a_second_release() -> None:
    semaphore = FairSemaphore(2)
    assert semaphore.acquire(blocking=False) and semaphore.acquire(blocking=False)
    assert not semaphore.acquire(blocking=False)
    assert not semaphore.acquire(timeout=0.01)
    semaphore.release()
    assert semaphore.acquire(timeout=0)
    with pytest.raises(ValueError):
        FairSemaphore(-1)
    lock = FairLock()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()


def test_mutual_exclusion_and_progress_under_contention() -> None:
    lock = FairLock()
    per_thread, threads = 2000, 8
    counter = [0]
    inside = [0]
    overlaps: list[int] = []

    def work() -> None:
        for _ in range(per_thread):
            with lock:
                inside[0] += 1
                if inside[0] != 1:
                    overlaps.append(inside[0])
                counter[0] += 1
                inside[0] -= 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not any(worker.is_alive() for worker in workers)
    assert counter[0] == per_thread * threads and not overlaps
    assert not lock.locked() and not lock._waiters


GEVENT_SCENARIOS = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, threading
    import gevent
    from api.core.durable_stream._fair import FairLock

    report = {}

    # Three greenlets re-take the lock in a tight loop, yielding only while they hold it (as an
    # appender does while SQLite works in the threadpool); a fourth asks for it once.
    lock = FairLock()
    taken = []
    stop = False

    def hog(index):
        while not stop:
            with lock:
                taken.append(index)
                gevent.sleep(0)

    hogs = [gevent.spawn(hog, index) for index in range(3)]
    gevent.sleep(0.05)
    asked_at = len(taken)
    turn = gevent.spawn(lambda: lock.acquire(timeout=5.0))
    granted = turn.get(timeout=10)
    report["granted"] = granted
    report["passed_before_turn"] = len(taken) - asked_at
    report["hogs_progressed"] = sorted(set(taken))
    stop = True
    lock.release()
    gevent.joinall(hogs, timeout=5)

    # A waiter blocks cooperatively: the hub keeps running other greenlets meanwhile.
    lock = FairLock()
    lock.acquire()
    ticks = []
    ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.01)) for _ in range(10)])
    report["timed_out"] = lock.acquire(timeout=0.2) is False
    ticker.join()
    report["ticks_during_wait"] = len(ticks)

    # A waiter interrupted by gevent.Timeout leaves the queue.
    try:
        with gevent.Timeout(0.05):
            lock.acquire()
    except gevent.Timeout:
        report["interrupted_left_queue"] = len(lock._waiters) == 0

    # A waiter interrupted after the lock was handed to it, before it ran: the lock is passed on.
    # The kill is scheduled first, so the victim sees it before the hand-over's wake-up.
    victim = gevent.spawn(lock.acquire)
    gevent.sleep(0.01)
    heir = gevent.spawn(lambda: lock.acquire(timeout=5.0))
    gevent.sleep(0.01)
    victim.kill(block=False)
    lock.release()  # handed to the victim
    report["heir_granted"] = heir.get(timeout=5)
    lock.release()
    report["free_at_the_end"] = lock.acquire(blocking=False)
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def gevent_report() -> dict[str, object]:
    result, _ = run_script(GEVENT_SCENARIOS)
    return result


def test_under_gevent_a_waiter_gets_its_turn_behind_greenlets_in_a_tight_loop(
    gevent_report: dict[str, object],
) -> None:
    assert gevent_report["granted"] is True
    assert gevent_report["hogs_progressed"] == [0, 1, 2]
    # At most the holder and the two greenlets queued before it.
    assert int(gevent_report["passed_before_turn"]) <= 3, gevent_report  # type: ignore[call-overload]


def test_under_gevent_a_waiter_blocks_cooperatively(gevent_report: dict[str, object]) -> None:
    assert gevent_report["timed_out"] is True
    assert gevent_report["ticks_during_wait"] == 10


def test_under_gevent_an_interrupted_waiter_leaves_and_passes_on_a_handed_over_lock(
    gevent_report: dict[str, object],
) -> None:
    assert gevent_report["interrupted_left_queue"] is True
    assert gevent_report["heir_granted"] is True
    assert gevent_report["free_at_the_end"] is True
