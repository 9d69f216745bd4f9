"""The identifier rules: what may reach a query, and that they fit what the app itself generates and stores."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import pytest
from itsdangerous import URLSafeTimedSerializer

from api.libs.errors import InvalidParamError
from api.models import App, WorkflowRun
from api.models.model import new_api_key, new_id
from api.services import validation


# The generated user gets a fixed test id: pytest-xdist workers must collect the same names.
@pytest.mark.parametrize(
    "user", ["u", " padded ", "é" * 255, "中文 user", pytest.param("web-" + new_id(), id="web-new-id")]
)
def test_users_that_are_kept_as_given(user: str) -> None:
    assert validation.require_user(user) == user


@pytest.mark.parametrize(
    "user",
    [None, 5, ["u"], "", "   ", "\u3000", "a\x00b", "a\tb", "a\x1bb", "a\x7f", "a\x85", "\ud800", "x\udfff", "u" * 256],
)
def test_users_that_are_refused(user: object) -> None:
    with pytest.raises(InvalidParamError):
        validation.require_user(user)


def test_the_limits_are_the_column_lengths() -> None:
    columns = {
        "end_user": (WorkflowRun.__table__.c.end_user, validation.MAX_USER_LENGTH),
        "api_key": (App.__table__.c.api_key, validation.MAX_API_KEY_LENGTH),
        "site_code": (App.__table__.c.site_code, validation.MAX_SITE_CODE_LENGTH),
    }
    for name, (column, limit) in columns.items():
        assert column.type.length == limit, name
    assert WorkflowRun.__table__.c.id.type.length == WorkflowRun.__table__.c.task_id.type.length == 36


def test_every_id_and_credential_the_app_makes_passes() -> None:
    for _ in range(200):
        assert validation.could_be_our_id(new_id())
        assert validation.could_be_credential(new_api_key(), validation.MAX_API_KEY_LENGTH)
        assert validation.could_be_credential(secrets.token_urlsafe(12), validation.MAX_SITE_CODE_LENGTH)


@pytest.mark.parametrize("mangle", [str.upper, lambda i: i[:-1], lambda i: i + "0", lambda i: i.replace("-", "")])
def test_near_misses_are_not_our_ids(mangle: Callable[[str], str]) -> None:
    genuine = new_id()
    assert not validation.could_be_our_id(mangle(genuine))
    assert not validation.could_be_our_id(genuine[:8] + "\x00" + genuine[9:])


@pytest.mark.parametrize("credential", ["", "app-\x00x", "app x", "app-é", "app-\x7f", "a" * 65])
def test_credentials_that_cannot_be_ours(credential: str) -> None:
    assert not validation.could_be_credential(credential, validation.MAX_API_KEY_LENGTH)


def test_only_the_issued_spelling_of_a_passport_passes() -> None:
    serializer = URLSafeTimedSerializer("secret", salt="web-passport")
    passport = serializer.dumps({"app_id": new_id(), "end_user": f"web-{new_id()}"})
    assert validation.could_be_passport(passport)
    signature = passport.rpartition(".")[2]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    spare_bits = {2: 4, 3: 2}[len(signature) % 4]  # a SHA-1 HMAC: 20 bytes, 27 characters
    trailing = passport[:-1] + alphabet[alphabet.index(passport[-1]) | 1]
    assert spare_bits and serializer.loads(trailing), "itsdangerous itself takes this spelling"
    for other in (trailing, passport + "=", passport + "==", passport + "\x00", passport * 9):
        assert not validation.could_be_passport(other), other
