"""Backend-independent pieces: connect(), cursor encoding, the public surface, import hygiene."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import struct
import subprocess
import sys
import urllib.parse

import pytest

import api.core.durable_stream as durable_stream
from api.core.durable_stream import Closed, CursorUnavailableError, connect
from api.core.durable_stream._cursor import CursorCodec
from api.core.durable_stream._driver import Position

PROPOSAL_NAMES = {
    "TopicCursor",
    "Closed",
    "CLOSED",
    "DurableStreamError",
    "CursorUnavailableError",
    "DurableStreamUnavailableError",
    "DurableStreamRecord",
    "DurableStreamSubscription",
    "DurableStreamProducer",
    "DurableStreamTopic",
}


def test_public_names_include_every_name_of_the_proposal() -> None:
    assert set(durable_stream.__all__) >= PROPOSAL_NAMES
    assert durable_stream.__all__ == sorted(durable_stream.__all__)


def test_error_hierarchy() -> None:
    assert issubclass(durable_stream.CursorUnavailableError, durable_stream.DurableStreamError)
    assert issubclass(durable_stream.DurableStreamUnavailableError, durable_stream.DurableStreamError)
    assert issubclass(durable_stream.TopicSealedError, durable_stream.DurableStreamUnavailableError)


def test_unknown_scheme_names_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"supported: .*memory://.*sqlite://"):
        connect("kafka://localhost:9092")


def test_unknown_and_invalid_options_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown option"):
        connect("memory://", colour="blue")
    with pytest.raises(ValueError, match="buffer_size"):
        connect("memory://", buffer_size=0)
    with pytest.raises(ValueError, match="max_records"):
        connect("memory://?max_records=lots")


def test_options_come_from_the_query_string_too() -> None:
    with connect("memory://?max_records=2") as backend:
        topic = backend.topic("t")
        for payload in (b"a", b"b", b"c"):
            topic.append(payload)
        info = backend.admin.topic_info("t")
        assert info is not None and info.first_ordinal == 2


def test_cursor_round_trip_and_binding() -> None:
    codec = CursorCodec("store", "topic")
    cursor = codec.encode("e" * 32, 41, "1700000000000-3")
    decoded = codec.decode(cursor)
    assert decoded.epoch == "e" * 32 and decoded.position == Position(41, "1700000000000-3")
    with pytest.raises(CursorUnavailableError):
        CursorCodec("store", "other").decode(cursor)
    with pytest.raises(CursorUnavailableError):
        CursorCodec("other-store", "topic").decode(cursor)
    assert "1700000000000" not in cursor, "a backend position must not show through the cursor"
    with_digest = codec.encode("e" * 32, 41, "1700000000000-3", "0123456789abcdef")
    assert codec.decode(with_digest).position == Position(41, "1700000000000-3", "0123456789abcdef")
    assert with_digest.startswith("2.") and cursor.startswith("2.")


def version_1_cursor(identity: str, topic: str, epoch: str, ordinal: int, native: str) -> str:
    """A cursor as the previous release wrote it (no record digest), built here byte for byte."""
    topic_digest = hashlib.blake2b(f"{identity}\0{topic}".encode(), digest_size=8).digest()
    body = struct.pack(">8sQ", topic_digest, ordinal) + bytes([len(epoch)]) + epoch.encode() + native.encode()
    raw = body + hashlib.blake2b(body, digest_size=6).digest()
    return "1." + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def test_cursors_of_the_previous_version_still_resume() -> None:
    with connect("memory://") as backend:
        topic = backend.topic("t")
        for payload in (b"a", b"b", b"c"):
            topic.append(payload)
        info = backend.admin.topic_info("t")
        assert info is not None
        identity = backend._engine.driver.identity
        old = version_1_cursor(identity, "t", info.epoch, 1, "")
        assert CursorCodec(identity, "t").decode(old).position == Position(1, "", "")
        position = backend.admin.cursor_position("t", old)
        assert (position.epoch, position.ordinal, position.digest) == (info.epoch, 1, "")
        with topic.subscribe_from_cursor(old) as resumed:  # type: ignore[arg-type]
            assert [resumed.receive(timeout=1).payload, resumed.receive(timeout=1).payload] == [b"b", b"c"]  # type: ignore[union-attr]
            # Its records' cursors are of the new version, and verify the history from there on.
            topic.append(b"d")
            record = resumed.receive(timeout=1)
            assert record is not None and record is not durable_stream.CLOSED
            assert record.cursor.startswith("2.") and backend.admin.cursor_position("t", record.cursor).digest
        # A version 1 cursor whose checksum does not hold is refused like any other.
        with pytest.raises(CursorUnavailableError) as caught:
            CursorCodec(identity, "t").decode(old[:-2] + ("AA" if old[-2:] != "AA" else "BB"))
        assert caught.value.reason == "malformed"


def test_importing_the_library_needs_no_driver_or_app_package() -> None:
    code = (
        "import sys; import api.core.durable_stream as d; d.connect('memory://').close(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'redis', 'psycopg', 'sqlalchemy', 'nats', 'gevent', 'flask', 'celery'}); print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_import_linter_contract_holds() -> None:
    result = subprocess.run([sys.executable, "-m", "importlinter.cli", "--no-cache"], capture_output=True, text=True)
    if "No module named importlinter.cli" in result.stderr:
        result = subprocess.run(["lint-imports", "--no-cache"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_backend_repr_shows_the_url_without_secrets(tmp_path: object) -> None:
    with connect(f"sqlite:////{str(tmp_path).lstrip('/')}/s.db?synchronous=normal") as backend:
        assert repr(backend) == f"<DurableStreamBackend sqlite:////{str(tmp_path).lstrip('/')}/s.db>"
    from api.core.durable_stream._connect import redact_url

    parts = urllib.parse.urlsplit("postgresql://app:s3cret@db:5432/x?schema=y")
    assert redact_url(parts) == "postgresql://app:***@db:5432/x"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_while_a_subscription_changes_state_leaves_the_child_able_to_subscribe() -> None:
    from tests.durable_stream import hooks

    with connect("memory://") as backend:
        topic = backend.topic("t")
        topic.append(b"one")
        # Another thread in the middle of an enter() or close() at the moment of the fork.
        with hooks.subscription_transitions():
            pid = os.fork()
            if pid == 0:  # the child: fail by SIGALRM if the lock came along held
                signal.alarm(5)
                try:
                    with topic.subscribe_from_beginning() as subscription:
                        record = subscription.receive(timeout=1.0)
                    os._exit(0 if record is not None and not isinstance(record, Closed) else 3)
                except BaseException:
                    os._exit(4)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
