from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from flask import request

from api.services import app_service


def validate_app_token(view: Callable[..., Any]) -> Callable[..., Any]:
    """Resolve the ``Authorization: Bearer <api key>`` header and pass the app as ``app_model``."""

    @functools.wraps(view)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        app_model = app_service.authenticate(request.headers.get("Authorization"))
        return view(*args, app_model=app_model, **kwargs)

    return decorated
