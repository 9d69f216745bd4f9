"""Backpressure: records wait in the backend; a reader that does not read costs no memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from api.core.durable_stream import DurableStreamBackend, DurableStreamTopic

from .base import ContractBase
from .helpers import drain

# Fewer, larger records than a workflow's events: appending costs per record (a round trip, a
# transaction), while what a subscriber would buffer grows with the bytes.
BULK_RECORDS = 20_000
BULK_PAYLOAD = 1000
BULK_THREADS = 4


class BackpressureContract(ContractBase):
    #: Options for the child process that appends the bulk records (e.g. a faster sync mode).
    bulk_append_options: dict[str, object] = {}

    def test_a_slow_subscriber_does_not_block_appends(self, topic: DurableStreamTopic) -> None:
        with topic.subscribe_from_tail() as idle:
            started = time.monotonic()
            for index in range(2000):
                topic.append(str(index).encode())
            assert time.monotonic() - started < 60
            assert [r.payload for r in drain(idle, 2000, timeout=60)] == [str(i).encode() for i in range(2000)]

    def test_records_piling_up_for_an_idle_subscriber_do_not_grow_its_memory(
        self, backend: DurableStreamBackend, topic: DurableStreamTopic, topic_name: str
    ) -> None:
        if self.store_in_process:
            pytest.skip("the store itself lives in this process")
        url = self.backend_url(**self.bulk_append_options)
        if url is None:
            pytest.skip("the adapter has no URL another process can open")
        process = psutil.Process()
        with topic.subscribe_from_tail() as subscription:
            assert subscription.receive(timeout=0.05) is None
            before = process.memory_info().rss
            _append_in_child(url, topic_name, BULK_RECORDS, BULK_PAYLOAD)
            # Observe for a while: shared readers and wake-ups react to the appends in the background.
            peak = before
            window_end = time.monotonic() + 1.0
            while time.monotonic() < window_end:
                peak = max(peak, process.memory_info().rss)
                time.sleep(0.05)
            grown = peak - before
            # Buffering them all would take well over 20 MB (1 KB payloads plus a record object each).
            assert grown < 5 * 1024 * 1024, f"RSS grew by {grown / 1e6:.1f} MB while the subscriber did not read"
            indices = [int(record.payload[:12]) for record in drain(subscription, BULK_RECORDS, timeout=300)]
            assert sorted(indices) == list(range(BULK_RECORDS)), "records were lost or repeated"
            for lane in range(BULK_THREADS):  # each appending thread's own records arrive in its order
                own = [index for index in indices if index % BULK_THREADS == lane]
                assert own == sorted(own)


def _append_in_child(url: str, topic_name: str, count: int, size: int) -> None:
    """Append ``count`` records from a separate OS process with a few threads, the way workers would."""
    script = textwrap.dedent(
        f"""
        import threading
        from api.core.durable_stream import connect
        with connect({url!r}) as backend:
            producer = backend.topic({topic_name!r}).as_producer()
            pad = b"x" * ({size} - 12)

            def lane(first):
                for index in range(first, {count}, {BULK_THREADS}):
                    producer.append(b"%012d" % index + pad)

            threads = [threading.Thread(target=lane, args=(n,)) for n in range({BULK_THREADS})]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        """
    )
    env = dict(os.environ)
    env.pop("GEVENT_SUPPORT", None)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600, env=env, cwd=_project_root())


def _project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
