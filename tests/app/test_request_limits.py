"""The JSON depth scan and the strict JSON provider, without HTTP (the HTTP side: test_hostile_input)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from typing import Any

import pytest
from flask import Flask
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api.configs import AppConfig
from api.libs.errors import InvalidParamError
from api.libs.request_limits import RequestJSONProvider, json_too_deep
from harness.processes import ROOT, process_env

# Characters that matter to a scan that must know where strings are.
_TRICKY = st.text(alphabet=st.sampled_from(list('[]{}"\\/,:ab \n\té\u2028\ud800')), max_size=12)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TRICKY,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TRICKY, children, max_size=4),
    max_leaves=40,
)


def nesting(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    return 0


@settings(max_examples=500, deadline=None)
@given(value=_JSON_VALUES, limit=st.integers(min_value=1, max_value=8), ensure_ascii=st.booleans())
def test_the_scan_agrees_with_the_nesting_of_the_parsed_value(value: Any, limit: int, ensure_ascii: bool) -> None:
    text = json.dumps(value, ensure_ascii=ensure_ascii)
    assert json_too_deep(text.encode("utf-8", "surrogatepass"), limit) == (nesting(value) > limit)


@pytest.mark.parametrize(
    ("text", "too_deep"),
    [
        ('["[[[[", "\\\\", [[]]]', False),  # brackets in strings, an escaped backslash ending one
        ('["\\"[[[[", [[]]]', False),  # an escaped quote does not end the string
        ('["\\\\\\"[[[["]', False),
        ("[[[[", True),  # unclosed: the parser would still descend four levels
        ("[[[]]]" * 1000, False),  # many siblings, none deep
        ('{"a": {"b": {"c": {}}}}', True),
        ('{"a": {"b": {"c": 1}}}', False),
        ("]]]][[[", False),  # the parser fails at the first character
    ],
)
def test_the_scan_on_hand_picked_text(text: str, too_deep: bool) -> None:
    assert json_too_deep(text.encode(), 3) is too_deep


def test_the_scan_takes_no_python_step_per_character() -> None:
    shapes = ["[" * 500_000 + "]" * 500_000, "[" + "[[]]," * 200_000 + "[]]", json.dumps(['[\\"{'] * 100_000)]
    lines = 0

    def count(frame: types.FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += event == "line"
        return count

    for shape in shapes:
        data = shape.encode()
        sys.settrace(count)
        try:
            json_too_deep(data, 32)
        finally:
            sys.settrace(None)
    assert lines < 20 * len(shapes), f"{lines} Python lines for {sum(map(len, shapes))} characters"


@pytest.fixture
def provider() -> RequestJSONProvider:
    return RequestJSONProvider(Flask("limits"), max_depth=8)


def test_the_provider_refuses_too_deep_text_before_parsing_it(provider: RequestJSONProvider) -> None:
    with pytest.raises(InvalidParamError, match="deeper than 8 levels"):
        provider.loads("[" * 100_000 + "]" * 100_000)
    assert provider.loads("[" * 8 + "]" * 8) == [[[[[[[[]]]]]]]]


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "1e999", "[-1e400]", "1" * 5000])
def test_numbers_json_does_not_have_are_refused(provider: RequestJSONProvider, text: str) -> None:
    with pytest.raises(ValueError):
        provider.loads(text)


@pytest.mark.parametrize("data", [b'"\xed\xa0\x80"', b'"\xff"', b'"\xc3\x28"', b"\xef\xbb\xbf\xff"])
def test_bytes_that_are_not_unicode_are_refused(provider: RequestJSONProvider, data: bytes) -> None:
    with pytest.raises(ValueError):
        provider.loads(data)


def test_escapes_stay_data(provider: RequestJSONProvider) -> None:
    # A lone surrogate or NUL written as an escape is valid JSON; the identifier rules refuse them where stored.
    assert provider.loads(b'["\\ud800", "\\u0000"]') == ["\ud800", "\x00"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
def test_other_unicode_encodings_are_scanned_as_text(provider: RequestJSONProvider, encoding: str) -> None:
    # Read as raw UTF-16/32 bytes, the escaped quote would look like the end of the string and the
    # nesting after it like the inside of another string.
    hidden = json.dumps({"note": 'a"b', "x": "@"}).replace('"@"', "[" * 50 + "]" * 50)
    with pytest.raises(InvalidParamError):
        provider.loads(hidden.encode(encoding))
    assert provider.loads(json.dumps({"a": [["é"]]}, ensure_ascii=False).encode(encoding)) == {"a": [["é"]]}


def test_a_deep_body_is_refused_on_small_stacks_and_in_greenlets() -> None:
    # A process of its own: without the check, a parser recursing 500,000 levels in a 256 KiB thread
    # can take the interpreter down rather than raise.
    code = """
import threading
import gevent
from flask import Flask
from api.libs.request_limits import RequestJSONProvider
from api.libs.errors import InvalidParamError

provider = RequestJSONProvider(Flask("small-stack"), max_depth=32)
deep = "[" * 500_000 + "]" * 500_000

def refuse():
    try:
        provider.loads(deep)
    except InvalidParamError:
        print("refused", flush=True)

threading.stack_size(256 * 1024)
thread = threading.Thread(target=refuse)
thread.start()
thread.join()
gevent.spawn(refuse).join()
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=process_env({}), capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() == ["refused", "refused"], (result.returncode, result.stderr[-2000:])


def test_the_limits_are_settings_with_safe_bounds() -> None:
    config = AppConfig()
    assert (config.MAX_REQUEST_BODY_BYTES, config.MAX_JSON_DEPTH) == (1 << 20, 32)
    assert AppConfig(MAX_JSON_DEPTH=200, MAX_REQUEST_BODY_BYTES=1).MAX_JSON_DEPTH == 200
    for bad in ({"MAX_JSON_DEPTH": 201}, {"MAX_JSON_DEPTH": 0}, {"MAX_REQUEST_BODY_BYTES": 0}):
        with pytest.raises(ValidationError):
            AppConfig(**bad)  # type: ignore[arg-type]
