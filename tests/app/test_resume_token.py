"""Resume tokens: AEAD round trip, binding to topic/app/user, key rotation, refusal of anything else."""

from __future__ import annotations

import base64
import os

import pytest
from pytest_mock import MockerFixture

from api.libs import resume_token
from api.libs.resume_token import InvalidResumeTokenError, ResumeTokenCodec, ResumeTokenKey, development_key, parse_keys

BOUND = {"topic": "workflow:workflow_run:r1", "app_id": "a1", "end_user": "u1"}


def key(kid: str) -> ResumeTokenKey:
    return ResumeTokenKey(kid, os.urandom(32))


def test_round_trip_and_opacity() -> None:
    codec = ResumeTokenCodec([key("k1")])
    token = codec.seal("1.cursor-text", **BOUND)
    assert "cursor" not in token and "=" not in token
    assert codec.open(token, **BOUND) == "1.cursor-text"
    assert codec.seal("1.cursor-text", **BOUND) != token, "a fresh nonce per token"


@pytest.mark.parametrize("field", ["topic", "app_id", "end_user"])
def test_a_token_is_bound_to_its_topic_app_and_user(field: str) -> None:
    codec = ResumeTokenCodec([key("k1")])
    token = codec.seal("c", **BOUND)
    with pytest.raises(InvalidResumeTokenError):
        codec.open(token, **{**BOUND, field: BOUND[field] + "x"})


def test_tampering_truncation_and_garbage_are_refused() -> None:
    codec = ResumeTokenCodec([key("k1")])
    token = codec.seal("c", **BOUND)
    for index in range(len(token)):
        flipped = token[:index] + ("A" if token[index] != "A" else "B") + token[index + 1 :]
        with pytest.raises(InvalidResumeTokenError):
            codec.open(flipped, **BOUND)
    for bad in ["", "x", token[:-1], token[:10], "!!!!", "a" * 5000, token + "AAAA"]:
        with pytest.raises(InvalidResumeTokenError):
            codec.open(bad, **BOUND)


def test_rotation_new_tokens_use_the_first_key_all_keys_decrypt() -> None:
    old, new = key("old"), key("new")
    before = ResumeTokenCodec([old]).seal("c", **BOUND)
    rotated = ResumeTokenCodec([new, old])
    assert rotated.open(before, **BOUND) == "c"
    after = rotated.seal("c", **BOUND)
    assert ResumeTokenCodec([new]).open(after, **BOUND) == "c"
    with pytest.raises(InvalidResumeTokenError, match="unknown key"):
        ResumeTokenCodec([old]).open(after, **BOUND)
    with pytest.raises(InvalidResumeTokenError):
        ResumeTokenCodec([ResumeTokenKey("new", os.urandom(32))]).open(after, **BOUND)


def test_aes_gcm_fallback_interoperates(mocker: MockerFixture) -> None:
    shared = [key("k1")]
    siv = ResumeTokenCodec(shared)
    mocker.patch.object(resume_token, "gcm_siv_available", return_value=False)  # an OpenSSL without SIV
    gcm = ResumeTokenCodec(shared)
    assert gcm.algorithm == "AES-256-GCM"
    assert siv.open(gcm.seal("c", **BOUND), **BOUND) == "c"


def test_keys_setting_and_development_key() -> None:
    secret = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    keys = parse_keys(f"2026a:{secret}, 2025b:{secret}")
    assert [k.key_id for k in keys] == ["2026a", "2025b"]
    assert parse_keys("") == []
    for bad in ("nokey", "k:short", f"k:{secret},k:{secret}", "k:!!!"):
        with pytest.raises(ValueError):
            parse_keys(bad)
    assert development_key("s1").secret == development_key("s1").secret != development_key("s2").secret


def _spellings(token: str) -> dict[str, str]:
    """Strings Python's lenient base64 decoder turns into the same bytes as ``token``."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    spellings = {
        "dots inserted": token[:7] + "...." + token[7:],
        "space inserted": token[:7] + " " + token[7:],
        "newline inserted": token[:7] + "\n" + token[7:],
        "trailing newline": token + "\n",
        "standard alphabet": token.replace("-", "+").replace("_", "/"),
        "padded": token + "=" * (-len(token) % 4 or 4),
        "inner padding": token[:8] + "==" + token[8:],
    }
    spare_bits = {2: 4, 3: 2}.get(len(token) % 4)
    if spare_bits:
        last = alphabet.index(token[-1])
        spellings["trailing bits set"] = token[:-1] + alphabet[last | ((1 << spare_bits) - 1)]
    return spellings


@pytest.mark.parametrize("cursor_length", [1, 2, 3, 4])  # every remainder of the length mod 4
def test_other_spellings_of_a_genuine_token_are_malformed(cursor_length: int) -> None:
    codec = ResumeTokenCodec([key("k1")])
    while True:
        token = codec.seal("c" * cursor_length, **BOUND)
        if "-" in token or "_" in token:
            break
    for name, spelling in _spellings(token).items():
        assert spelling != token, name
        same_bytes = base64.urlsafe_b64decode(spelling + "==") == base64.urlsafe_b64decode(token + "==")
        assert same_bytes, f"{name}: the lenient decoder must read the genuine bytes, or this test means nothing"
        with pytest.raises(InvalidResumeTokenError, match="malformed"):
            codec.open(spelling, **BOUND)
    assert codec.open(token, **BOUND) == "c" * cursor_length


def test_a_stream_sealer_makes_the_codecs_tokens() -> None:
    rotated = ResumeTokenCodec([key("new"), key("old")])
    sealer = rotated.sealer(**BOUND)
    cursors = [f"1.cursor-{index}" for index in range(600)]  # past a nonce buffer's worth, twice
    tokens = [sealer.seal(cursor) for cursor in cursors]
    assert [rotated.open(token, **BOUND) for token in tokens] == cursors
    assert sealer.seal_bytes("1.c") != sealer.seal_bytes("1.c"), "a fresh nonce per token"
    assert sealer.seal_bytes("1.c").decode("ascii") != sealer.seal("1.c")
    for field in BOUND:
        with pytest.raises(InvalidResumeTokenError):
            rotated.open(tokens[0], **{**BOUND, field: BOUND[field] + "x"})


def test_nonces_are_never_shared_with_a_forked_child() -> None:
    sealer = ResumeTokenCodec([key("k1")]).sealer(**BOUND)
    sealer.seal("c")  # the buffer is filled; a child must not hand out the rest of it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.write(write, resume_token._NONCES.take())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 12 and child != resume_token._NONCES.take()
