"""Hostile requests against the workflow API, each with the answer it must get.

Built from genuine material (:class:`Target`: keys, passports, finished runs and their resume tokens)
so that a mutation is one step away from something the server does accept: a token with one bit
flipped, one character inserted or re-encoded in the standard alphabet; a genuine id with NUL; a body
one level deeper than the limit. Every case says which statuses and error codes are right and
whether a 2xx would be a wrong acceptance; :mod:`harness.hostile_check` judges the answers.

Case ``index`` seeds its own random generator, so the same seed and count give the same kinds and
mutations against any target (two databases get comparable case lists).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import string
from collections.abc import Callable
from urllib.parse import quote

from harness.http_transport import HttpRequest

__all__ = ["KINDS", "Case", "Expect", "GenuineRun", "Target", "generate_cases"]

_B64URL = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"  # in value order
# Control characters any HTTP server may refuse in a header before the app sees it.
_HEADER_CONTROLS = frozenset(chr(c) for c in (*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F))
_LONGEST_TARGET = 4000


@dataclasses.dataclass(frozen=True)
class Expect:
    statuses: frozenset[int]
    #: The JSON error ``code`` an error answer must carry; empty: not checked.
    codes: frozenset[str] = frozenset()
    #: Whether a 2xx is right; otherwise a 2xx is a wrong acceptance.
    accept: bool = False


@dataclasses.dataclass(frozen=True)
class Case:
    index: int
    kind: str
    request: HttpRequest
    expect: Expect

    @property
    def server_may_refuse(self) -> bool:
        """Whether a real HTTP server may answer before the app: control characters in a header (400)
        or a request line longer than gunicorn's ``limit_request_line`` of 4094 bytes (414)."""
        if len(self.request.target) > _LONGEST_TARGET:
            return True
        return any(_HEADER_CONTROLS.intersection(value) for _, value in self.request.headers)


@dataclasses.dataclass(frozen=True)
class GenuineRun:
    run_id: str
    task_id: str
    tokens: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Target:
    """Genuine material: two apps, two end users, a web end user, and finished runs of each."""

    api_key: str
    other_api_key: str  # another app's key
    site_code: str
    passport: str
    other_passport: str  # another web end user of the same app
    user: str
    other_user: str
    run: GenuineRun  # a finished run of ``user`` in the app of ``api_key``
    sibling_run: GenuineRun  # another finished run of ``user`` in that app
    other_users_run: GenuineRun  # a finished run of ``other_user`` in that app
    other_apps_run: GenuineRun  # a finished run of ``user`` in the other app
    web_run: GenuineRun  # a finished run of the passport's end user
    max_body_bytes: int
    max_json_depth: int
    input_name: str  # the one required input of the app's workflow


def _expect(status: int, code: str | None = None, *, accept: bool = False) -> Expect:
    return Expect(frozenset({status}), frozenset({code}) if code else frozenset(), accept)


ACCEPTED = _expect(202, accept=True)
OK = _expect(200, accept=True)
INVALID_PARAM = _expect(400, "invalid_param")
INVALID_TOKEN = _expect(400, "invalid_resume_token")
TOO_LARGE = _expect(413, "request_too_large")
UNAUTHORIZED = _expect(401, "unauthorized")


@dataclasses.dataclass(frozen=True)
class _Built:
    request: HttpRequest
    expect: Expect


Builder = Callable[[Target, random.Random], _Built]


def generate_cases(target: Target, count: int, seed: int) -> list[Case]:
    """``count`` cases; the kinds are drawn with the weights of :data:`KINDS`."""
    names = list(KINDS)
    weights = [KINDS[name][0] for name in names]
    cases = []
    for index in range(count):
        rng = random.Random(f"{seed}:{index}")
        kind = rng.choices(names, weights)[0]
        built = KINDS[kind][1](target, rng)
        cases.append(Case(index, kind, built.request, built.expect))
    return cases


# --- encoding helpers -----------------------------------------------------------------------------


def _q(value: str) -> str:
    return quote(value, safe="", errors="surrogatepass")


def _bearer(token: str) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


def _json_request(target: str, auth: str, body: bytes, *, chunked: bool = False) -> HttpRequest:
    headers = (_bearer(auth), ("Content-Type", "application/json"))
    return HttpRequest("POST", target, headers, body, chunked)


def _dumps(value: object) -> bytes:
    return json.dumps(value).encode()


def _nested(depth: int) -> str:
    """JSON text of ``depth`` arrays inside each other."""
    return "[" * depth + "]" * depth


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def _index(rng: random.Random, low: int, high: int) -> int:
    """A position in ``[low, high]`` from exactly one draw, whatever the range: genuine material differs
    in length between servers (a passport's compressed payload), and ``randint`` would then consume a
    different number of draws, so later choices, and the two servers' case lists, would diverge."""
    return low + int(rng.random() * (high - low + 1))


def _random_text(rng: random.Random, alphabet: str, low: int, high: int) -> str:
    return "".join(rng.choices(alphabet, k=rng.randint(low, high)))


def _run_body(target: Target, **fields: object) -> dict[str, object]:
    body: dict[str, object] = {"inputs": {target.input_name: "x"}, "user": target.user, "response_mode": "async"}
    body.update(fields)
    return body


# --- resume tokens --------------------------------------------------------------------------------


def _events_with_token(target: Target, rng: random.Random, token: str, *, web: bool = False) -> HttpRequest:
    """A reconnect of the target's run (or web run) with ``token``, in the header or the query."""
    in_header = rng.random() < 0.5 and _fits_a_header(token)
    if web:
        path, auth = f"/api/workflow/{target.web_run.task_id}/events", target.passport
        query = [] if in_header else [f"last_event_id={_q(token)}"]
    else:
        path, auth = f"/v1/workflow/{target.run.task_id}/events", target.api_key
        query = [f"user={_q(target.user)}"] + ([] if in_header else [f"last_event_id={_q(token)}"])
    headers = [_bearer(auth)] + ([("Last-Event-ID", token)] if in_header else [])
    return HttpRequest("GET", path + ("?" + "&".join(query) if query else ""), tuple(headers))


def _fits_a_header(value: str) -> bool:
    # HTTP clients send header values as Latin-1 and refuse line breaks in them.
    return all(ord(c) < 256 for c in value) and "\r" not in value and "\n" not in value


def _genuine_token(target: Target, rng: random.Random) -> tuple[str, bool]:
    web = rng.random() < 0.3
    return rng.choice((target.web_run if web else target.run).tokens), web


def _token_case(mutate: Callable[[str, random.Random], str]) -> Builder:
    def build(target: Target, rng: random.Random) -> _Built:
        token, web = _genuine_token(target, rng)
        mutated = mutate(token, rng)
        assert mutated != token and mutated.strip(" \t"), (token, mutated)
        return _Built(_events_with_token(target, rng, mutated, web=web), INVALID_TOKEN)

    return build


def _token_genuine(target: Target, rng: random.Random) -> _Built:
    token, web = _genuine_token(target, rng)
    return _Built(_events_with_token(target, rng, token, web=web), OK)


def _truncated(token: str, rng: random.Random) -> str:
    return token[: _index(rng, 1, len(token) - 1)]


def _bit_flipped(token: str, rng: random.Random) -> str:
    raw = bytearray(_unb64(token))
    for _ in range(rng.randint(1, 3)):
        raw[_index(rng, 0, len(raw) - 1)] ^= 1 << rng.randrange(8)
    flipped = _b64(bytes(raw))
    return flipped if flipped != token else _b64(bytes(raw) + b"\0")


def _char_swapped(token: str, rng: random.Random) -> str:
    index = _index(rng, 0, len(token) - 1)
    return token[:index] + rng.choice(_B64URL.replace(token[index], "")) + token[index + 1 :]


def _inserted(token: str, rng: random.Random) -> str:
    piece = rng.choice([".", "....", " ", "\n", "\t", "=", "%", "+", "/", "\x00", "é", "\u200b", "-_"])
    index = _index(rng, 1, len(token) - 1)
    return token[:index] + piece + token[index:]


def _standard_alphabet(token: str, rng: random.Random) -> str:
    if "-" not in token and "_" not in token:
        return token + "+"
    return token.replace("-", "+").replace("_", "/")


def _padded(token: str, rng: random.Random) -> str:
    return token + "=" * rng.randint(1, 3)


def _trailing_bits(token: str, rng: random.Random) -> str:
    """Same bytes, other spelling: unused low bits of the last character set (or padding if none)."""
    spare_bits = {2: 4, 3: 2}.get(len(token) % 4)
    if spare_bits is None:
        return _padded(token, rng)
    last = _B64URL.index(token[-1])
    return token[:-1] + _B64URL[last | _index(rng, 1, (1 << spare_bits) - 1)]


def _case_flipped(token: str, rng: random.Random) -> str:
    letters = [i for i, c in enumerate(token) if c.isalpha()]
    index = letters[_index(rng, 0, len(letters) - 1)]
    return token[:index] + token[index].swapcase() + token[index + 1 :]


def _appended(token: str, rng: random.Random) -> str:
    return token + _random_text(rng, _B64URL, 1, 8)


def _doubled(token: str, rng: random.Random) -> str:
    return token + token


def _huge(token: str, rng: random.Random) -> str:
    return token + _random_text(rng, _B64URL, 2100, 4000)


def _garbage(token: str, rng: random.Random) -> str:
    return _random_text(rng, string.ascii_letters + string.digits + string.punctuation, 1, 120)


def _foreign_token(pick: Callable[[Target], GenuineRun]) -> Builder:
    def build(target: Target, rng: random.Random) -> _Built:
        return _Built(_events_with_token(target, rng, rng.choice(pick(target).tokens)), INVALID_TOKEN)

    return build


# --- JSON bodies ----------------------------------------------------------------------------------


def _body_endpoints(target: Target) -> list[tuple[str, str, dict[str, object]]]:
    """(path, credential, a body that endpoint accepts) for every endpoint that reads a JSON body."""
    run_body = _run_body(target)
    return [
        ("/v1/workflows/run", target.api_key, run_body),
        (f"/v1/workflows/tasks/{target.run.task_id}/stop", target.api_key, {"user": target.user}),
        (f"/v1/workflows/runs/{target.run.run_id}/human-input", target.api_key, {"user": target.user, "inputs": {}}),
        ("/api/workflows/run", target.passport, {"inputs": {target.input_name: "x"}, "response_mode": "async"}),
    ]


def _body_deep(target: Target, rng: random.Random) -> _Built:
    path, auth, body = rng.choice(_body_endpoints(target))
    depth = rng.choice([target.max_json_depth + 1, rng.randint(target.max_json_depth + 1, 200), 1000, 50_000])
    deep = _nested(depth)
    placement = rng.choice(["top", "field", "inputs", "user"])
    if placement == "top":
        text = deep
    else:
        key = {"field": "extra", "inputs": "inputs", "user": "user"}[placement]
        text = json.dumps({**body, key: "@"}).replace('"@"', deep)
    return _Built(_json_request(path, auth, text.encode()), INVALID_PARAM)


def _body_at_depth_limit(target: Target, rng: random.Random) -> _Built:
    # The body object is the first level.
    nested = _nested(target.max_json_depth - 1)
    text = json.dumps(_run_body(target, extra="@")).replace('"@"', nested)
    return _Built(_json_request("/v1/workflows/run", target.api_key, text.encode()), ACCEPTED)


def _body_oversize(target: Target, rng: random.Random) -> _Built:
    padding = target.max_body_bytes + rng.randint(1, 64 * 1024)
    body = _dumps(_run_body(target, extra="a" * padding))
    return _Built(_json_request("/v1/workflows/run", target.api_key, body, chunked=rng.random() < 0.5), TOO_LARGE)


def _body_large_but_allowed(target: Target, rng: random.Random) -> _Built:
    extra: object = rng.choice(["a" * rng.randint(64 * 1024, 256 * 1024), [[]] * rng.randint(1000, 20_000)])
    body = _dumps(_run_body(target, extra=extra))
    return _Built(_json_request("/v1/workflows/run", target.api_key, body, chunked=rng.random() < 0.5), ACCEPTED)


_WRONG_TYPES: dict[str, list[object]] = {
    "user": [5, 1.5, True, None, [], {}, ["u"], ""],
    "inputs": ["x", 5, [], None, {}, {"other": 1}],  # the last two lack the required input
    "response_mode": [5, None, [], "carrier-pigeon", "ASYNC", ""],
}


def _body_wrong_type(target: Target, rng: random.Random) -> _Built:
    field = rng.choice(["user", "inputs", "response_mode", "top"])
    if field == "top":
        return _Built(
            _json_request("/v1/workflows/run", target.api_key, rng.choice([b"[]", b'"x"', b"5", b"true"])),
            INVALID_PARAM,
        )
    value = rng.choice(_WRONG_TYPES[field])
    return _Built(
        _json_request("/v1/workflows/run", target.api_key, _dumps(_run_body(target, **{field: value}))), INVALID_PARAM
    )


def _unstorable_user(target: Target, rng: random.Random, *, surrogates: bool = True) -> str:
    """The genuine user with a control character or (in JSON, where an escape can carry one) a lone surrogate."""
    controls = ["\x00", "\x01", "\x07", "\t", "\n", "\x1f", "\x7f", "\x85", "\x9f"]
    bad = rng.choice(controls + (["\ud800", "\udfff"] if surrogates else []))
    index = _index(rng, 0, len(target.user))
    return target.user[:index] + bad + target.user[index:]


def _bad_user(target: Target, rng: random.Random) -> object:
    return rng.choice(
        [
            _unstorable_user(target, rng),
            "u" * rng.randint(256, 5000),
            rng.choice(["", " ", "\u3000", None, 5, ["u"]]),
        ]
    )


def _body_bad_user(target: Target, rng: random.Random) -> _Built:
    path, auth, body = rng.choice(_body_endpoints(target)[:3])
    return _Built(_json_request(path, auth, _dumps({**body, "user": _bad_user(target, rng)})), INVALID_PARAM)


def _body_user_at_limit(target: Target, rng: random.Random) -> _Built:
    user = _random_text(rng, string.ascii_letters + "éß中 ", 255, 255).strip() or "u"
    user = (user + "x" * 255)[:255]
    return _Built(_json_request("/v1/workflows/run", target.api_key, _dumps(_run_body(target, user=user))), ACCEPTED)


def _body_odd_inputs(target: Target, rng: random.Random) -> _Built:
    """Input values are data: NUL, surrogates, control characters and odd keys are kept as given."""
    value = rng.choice(["a\x00b", "\ud800", "\udfff\ud800", "\x07\x1b[0m", "‮", "x" * 5000, {"\x00": [None]}])
    inputs = {target.input_name: value, rng.choice(["\x00", "\ud800", "", "a" * 300]): 1}
    body = _dumps(_run_body(target, inputs=inputs))
    return _Built(_json_request("/v1/workflows/run", target.api_key, body), ACCEPTED)


def _body_not_json(target: Target, rng: random.Random) -> _Built:
    valid = json.dumps(_run_body(target)).encode()
    cut = _index(rng, 1, len(valid) - 1)
    body = rng.choice(
        [
            valid[:cut],  # truncated
            valid + b"}",  # trailing garbage
            valid.replace(b'"', b"'"),  # single quotes
            valid[:cut] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]) + valid[cut:],
            valid.replace(b'"x"', rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400"])),
            valid.replace(b'"x"', b"1" * rng.randint(4301, 20_000)),
            valid.replace(b"}", b",}", 1),  # trailing comma
            b"/* comment */" + valid,
            b"",
        ]
    )
    return _Built(_json_request("/v1/workflows/run", target.api_key, body), INVALID_PARAM)


def _body_duplicate_keys(target: Target, rng: random.Random) -> _Built:
    """The last of duplicate keys wins, as in every JSON parser that does not refuse them."""
    good, bad = json.dumps(target.user), rng.choice(['"\\u0000"', "5", '""', "null"])
    first, last = (good, bad) if rng.random() < 0.5 else (bad, good)
    name = json.dumps(target.input_name)
    text = f'{{"inputs": {{{name}: "x"}}, "user": {first}, "response_mode": "async", "user": {last}}}'
    return _Built(
        _json_request("/v1/workflows/run", target.api_key, text.encode()), ACCEPTED if last == good else INVALID_PARAM
    )


def _body_other_encoding(target: Target, rng: random.Random) -> _Built:
    encoding = rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
    body = json.dumps(_run_body(target), ensure_ascii=False).encode(encoding)
    return _Built(_json_request("/v1/workflows/run", target.api_key, body), ACCEPTED)


def _body_other_encoding_deep(target: Target, rng: random.Random) -> _Built:
    encoding = rng.choice(["utf-16", "utf-16-le", "utf-32-be"])
    # Brackets inside an escaped string, then real ones: only a scan of the decoded text tells them apart.
    text = json.dumps(_run_body(target, note='\\" [[[', extra="@")).replace('"@"', _nested(1000))
    return _Built(_json_request("/v1/workflows/run", target.api_key, text.encode(encoding)), INVALID_PARAM)


def _body_without_json(target: Target, rng: random.Random) -> _Built:
    body = _dumps(_run_body(target))
    content_type = rng.choice(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"])
    headers = (_bearer(target.api_key), ("Content-Type", content_type))
    return _Built(HttpRequest("POST", "/v1/workflows/run", headers, rng.choice([body, None])), INVALID_PARAM)


def _stop_genuine(target: Target, rng: random.Random) -> _Built:
    """Stopping a finished run is a no-op that succeeds (idempotent)."""
    if rng.random() < 0.5:
        request = HttpRequest(
            "POST", f"/api/workflows/tasks/{target.web_run.task_id}/stop", (_bearer(target.passport),)
        )
        return _Built(request, OK)
    body = _dumps({"user": target.user})
    return _Built(_json_request(f"/v1/workflows/tasks/{target.run.task_id}/stop", target.api_key, body), OK)


def _human_input_finished(target: Target, rng: random.Random) -> _Built:
    body = _dumps({"user": target.user, "inputs": {"approved": "true"}})
    path = f"/v1/workflows/runs/{target.run.run_id}/human-input"
    return _Built(_json_request(path, target.api_key, body), _expect(409, "workflow_not_paused"))


def _human_input_wrong_inputs(target: Target, rng: random.Random) -> _Built:
    body = _dumps({"user": target.user, "inputs": rng.choice(["x", 5, [], None])})
    path = f"/v1/workflows/runs/{target.run.run_id}/human-input"
    return _Built(_json_request(path, target.api_key, body), INVALID_PARAM)


def _web_run(target: Target, rng: random.Random) -> _Built:
    if rng.random() < 0.5:
        body = _dumps({"inputs": {target.input_name: "web"}, "response_mode": "async"})
        return _Built(_json_request("/api/workflows/run", target.passport, body), ACCEPTED)
    body = rng.choice([b"[]", b'"x"', b"null", b"{", _dumps({"inputs": [], "response_mode": "async"})])
    return _Built(_json_request("/api/workflows/run", target.passport, body), INVALID_PARAM)


# --- paths and query strings ----------------------------------------------------------------------


def _fuzzed_id(target: Target, rng: random.Random, genuine: str) -> str:
    """Something that is not one of the app's ids for this user, spelled close to one where possible."""
    index = _index(rng, 0, len(genuine) - 1)
    choice = rng.randrange(12)
    value = [
        lambda: genuine[:index] + "\x00" + genuine[index:],
        lambda: genuine.upper(),
        lambda: genuine + rng.choice(["x", "0", " ", "\x00", "é", "%"]),
        lambda: genuine[:-1],
        lambda: " " + genuine,
        lambda: genuine.replace("-", ""),
        lambda: _random_text(rng, string.ascii_letters + string.digits + "-_.~!$&'()*+,;=:@", 1, 80),
        lambda: "a" * rng.randint(37, 1200),
        lambda: _random_text(rng, "éß中\U0001f600\u202e\ufeff", 1, 40),
        lambda: rng.choice(["\ud800", "\x00", "\x7f", "%00", "%", "null", "None", "0", "-1", "../x"]),
        lambda: target.other_apps_run.run_id if rng.random() < 0.5 else target.other_apps_run.task_id,
        lambda: target.other_users_run.run_id if rng.random() < 0.5 else target.other_users_run.task_id,
    ][choice]()
    return value.replace("/", "%2F")  # a decoded "/" would leave the route: a test of the router, not of ids


def _path_id(target: Target, rng: random.Random) -> _Built:
    user, key = _q(target.user), target.api_key
    routes: list[tuple[str, str, str, str, bytes | None]] = [
        ("GET", "/v1/workflows/run/{}?user=" + user, target.run.run_id, "not_found", None),
        ("GET", "/v1/workflow/{}/events?user=" + user, target.run.task_id, "not_found", None),
        # Dify stops a task whoever asks, and answers an unknown one as a success (200, not 404).
        ("POST", "/v1/workflows/tasks/{}/stop", target.run.task_id, "", _dumps({"user": target.user})),
        (
            "POST",
            "/v1/workflows/runs/{}/human-input",
            target.run.run_id,
            "not_found",
            _dumps({"user": target.user, "inputs": {}}),
        ),
        ("GET", "/api/workflow/{}/events", target.web_run.task_id, "not_found", None),
        ("POST", "/api/workflows/tasks/{}/stop", target.web_run.task_id, "not_found", None),
        # The target's runs open no form: any form token, however close to a genuine id, is unknown.
        ("GET", "/v1/form/human_input/{}", target.run.run_id, "not_found", None),
        (
            "POST",
            "/v1/form/human_input/{}",
            target.run.run_id,
            "not_found",
            _dumps({"user": target.user, "inputs": {}, "action": "submit"}),
        ),
        ("GET", "/api/form/human_input/{}", target.web_run.run_id, "not_found", None),
    ]
    method, template, genuine, code, body = rng.choice(routes)
    auth = target.passport if template.startswith("/api/") else key
    segment = _fuzzed_id(target, rng, genuine)
    headers = [_bearer(auth)] + ([("Content-Type", "application/json")] if body is not None else [])
    request = HttpRequest(method, template.format(_q(segment)), tuple(headers), body)
    return _Built(request, _expect(404, code) if code else OK)


def _query_user(target: Target, rng: random.Random) -> _Built:
    events = rng.random() < 0.5
    path = f"/v1/workflow/{target.run.task_id}/events" if events else f"/v1/workflows/run/{target.run.run_id}"
    not_found = _expect(404, "not_found")
    user = _q(target.user)
    query, expect = rng.choice(
        [
            # A query string cannot carry a lone surrogate: its percent-encoded bytes decode to U+FFFD.
            (f"user={_q(_unstorable_user(target, rng, surrogates=False))}", INVALID_PARAM),
            (f"user={'u' * rng.randint(256, 2000)}", INVALID_PARAM),
            (rng.choice(["user=", "user=%20", "user=%09"]), INVALID_PARAM),
            # No user at all: the events need one; a run's detail, as Dify documents it, does not.
            (rng.choice(["", "users=x", f"USER={user}"]), INVALID_PARAM if events else OK),
            (f"user={_q(target.other_user)}", not_found),
            (rng.choice(["user=%ff", "user=%zz", "user=%", f"user={user}%C3"]), not_found),
            (f"user={_q(target.other_user)}&user={user}", not_found),
            (f"user={user}&continue_on_pause={_q(_random_text(rng, string.printable, 0, 30))}", OK),
            (f"user={user}", OK),
        ]
    )
    return _Built(HttpRequest("GET", path + "?" + query, (_bearer(target.api_key),)), expect)


# --- Idempotency-Key -------------------------------------------------------------------------------

_VISIBLE_ASCII = "".join(chr(c) for c in range(0x21, 0x7F))


def _idempotency_key(target: Target, rng: random.Random) -> _Built:
    """A run's POST with an ``Idempotency-Key``: 1 to 255 visible ASCII characters, else 400."""
    genuine = _random_text(rng, _VISIBLE_ASCII, 1, 255)
    index = _index(rng, 1, len(genuine))
    key, expect = rng.choice(
        [
            (genuine, ACCEPTED),
            (_random_text(rng, _VISIBLE_ASCII, 255, 255), ACCEPTED),
            (_random_text(rng, _VISIBLE_ASCII, 256, 2000), INVALID_PARAM),
            # Inside the key (HTTP drops whitespace around a header's value, not within it).
            (
                genuine[:index] + rng.choice([" ", "\t", "é", "\xa0", "\x7f", "\x01"]) + "k" + genuine[index:],
                INVALID_PARAM,
            ),
        ]
    )
    headers = (_bearer(target.api_key), ("Content-Type", "application/json"), ("Idempotency-Key", key))
    # A body of its own per case: the same key with another body would be a reuse (422).
    body = _dumps(_run_body(target, inputs={target.input_name: key}))
    return _Built(HttpRequest("POST", "/v1/workflows/run", headers, body), expect)


# --- credentials ----------------------------------------------------------------------------------


def _credential_variant(rng: random.Random, genuine: str) -> str:
    index = _index(rng, 1, len(genuine) - 1)
    return rng.choice(
        [
            genuine + rng.choice(["x", "\x00", "é", "%00", "="]),
            genuine[:-1],
            genuine[:index] + "\x00" + genuine[index:],
            genuine[:index] + rng.choice(["\x01", "\x1f", "\x7f", "\t"]) + genuine[index:],
            genuine.swapcase(),
            genuine * rng.randint(2, 40),
            genuine + "A" * rng.randint(1000, 6000),
            _random_text(rng, "éß\xa0\xff", 1, 40),
        ]
    )


def _api_key(target: Target, rng: random.Random) -> _Built:
    path = f"/v1/workflows/run/{target.run.run_id}?user={_q(target.user)}"
    if rng.random() < 0.15:
        return _Built(HttpRequest("GET", path, (_bearer(target.other_api_key),)), _expect(404, "not_found"))
    header = rng.choice(
        [
            f"Bearer {_credential_variant(rng, target.api_key)}",
            f"Basic {target.api_key}",
            "Bearer",
            "Bearer ",
            "",
            target.api_key,
        ]
    )
    return _Built(HttpRequest("GET", path, (("Authorization", header),)), UNAUTHORIZED)


def _site_code(target: Target, rng: random.Random) -> _Built:
    if rng.random() < 0.15:
        return _Built(HttpRequest("GET", "/api/passport", (("X-App-Code", target.site_code),)), OK)
    headers = () if rng.random() < 0.1 else (("X-App-Code", _credential_variant(rng, target.site_code)),)
    return _Built(HttpRequest("GET", "/api/passport", headers), _expect(404, "app_not_found"))


def _passport(target: Target, rng: random.Random) -> _Built:
    path = f"/api/workflow/{target.web_run.task_id}/events"
    roll = rng.random()
    if roll < 0.1:
        return _Built(HttpRequest("GET", path, (_bearer(target.passport),)), OK)
    if roll < 0.25:
        return _Built(HttpRequest("GET", path, (_bearer(target.other_passport),)), _expect(404, "not_found"))
    forged = rng.choice([_credential_variant(rng, target.passport), _char_swapped(target.passport, rng)])
    return _Built(HttpRequest("GET", path, (_bearer(forged),)), UNAUTHORIZED)


#: kind -> (weight, builder)
KINDS: dict[str, tuple[int, Builder]] = {
    "token.genuine": (4, _token_genuine),
    "token.truncated": (4, _token_case(_truncated)),
    "token.bit_flip": (6, _token_case(_bit_flipped)),
    "token.char_swap": (4, _token_case(_char_swapped)),
    "token.inserted": (6, _token_case(_inserted)),
    "token.std_alphabet": (4, _token_case(_standard_alphabet)),
    "token.padded": (2, _token_case(_padded)),
    "token.trailing_bits": (3, _token_case(_trailing_bits)),
    "token.case_flip": (2, _token_case(_case_flipped)),
    "token.appended": (2, _token_case(_appended)),
    "token.doubled": (1, _token_case(_doubled)),
    "token.huge": (1, _token_case(_huge)),
    "token.garbage": (2, _token_case(_garbage)),
    "token.cross_run": (3, _foreign_token(lambda t: t.sibling_run)),
    "token.cross_user": (3, _foreign_token(lambda t: t.other_users_run)),
    "token.cross_app": (3, _foreign_token(lambda t: t.other_apps_run)),
    "body.deep": (6, _body_deep),
    "body.at_depth_limit": (1, _body_at_depth_limit),
    "body.oversize": (1, _body_oversize),
    "body.large_allowed": (1, _body_large_but_allowed),
    "body.wrong_type": (4, _body_wrong_type),
    "body.bad_user": (6, _body_bad_user),
    "body.user_at_limit": (1, _body_user_at_limit),
    "body.odd_inputs": (2, _body_odd_inputs),
    "body.not_json": (4, _body_not_json),
    "body.duplicate_keys": (2, _body_duplicate_keys),
    "body.utf16_32": (1, _body_other_encoding),
    "body.utf16_32_deep": (1, _body_other_encoding_deep),
    "body.not_json_type": (1, _body_without_json),
    "body.stop_finished": (2, _stop_genuine),
    "body.human_input_finished": (1, _human_input_finished),
    "body.human_input_inputs": (1, _human_input_wrong_inputs),
    "body.web_run": (1, _web_run),
    "path.id": (8, _path_id),
    "header.idempotency_key": (2, _idempotency_key),
    "query.user": (5, _query_user),
    "auth.api_key": (4, _api_key),
    "auth.site_code": (2, _site_code),
    "auth.passport": (3, _passport),
}
