from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from flask import g, request

from api.services import app_service
from api.services.credentials import Credential


def validate_app_token(view: Callable[..., Any]) -> Callable[..., Any]:
    """Resolve the ``Authorization: Bearer <api key>`` header and pass the app as ``app_model``.

    ``g.credential`` is what the request proved (:class:`~api.services.credentials.Credential`): an open
    stream asks ``credentials.still_valid`` about it while it lasts.
    """

    @functools.wraps(view)
    def decorated(*args: Any, **kwargs: Any) -> Any:
        authorization = request.headers.get("Authorization")
        app_model = app_service.authenticate(authorization)
        g.credential = Credential.for_key(app_model.id, app_service.bearer_key(authorization))
        return view(*args, app_model=app_model, **kwargs)

    return decorated
