"""What a client of either flavour holds and decides without I/O: where it sends, with which
credentials and within which budget, and the call or stream session of each request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import httpx

from .common import DEFAULT_READ_TIMEOUT, ReconnectHook, timeouts
from .errors import ProtocolError
from .forms import HumanInputForm
from .models import Passport
from .protocol import SERVICE_ROUTES, WEB_ROUTES, IdempotencyKey, Request, Routes, StreamState, idempotency_key
from .retry import RetryPolicy
from .sessions import Call, StreamSession

HttpClient = TypeVar("HttpClient", bound=httpx.Client | httpx.AsyncClient)


class ClientBase(Generic[HttpClient]):
    """The state both I/O flavours share; they add sending and waiting."""

    def __init__(
        self,
        base_url: str,
        routes: Routes,
        retry: RetryPolicy | None,
        read_timeout: float,
        on_reconnect: ReconnectHook | None,
        http_client: HttpClient | None,
    ) -> None:
        self.routes = routes
        self.retry = retry or RetryPolicy()
        self.on_reconnect = on_reconnect
        self._owns_http = http_client is None
        self.http: HttpClient = http_client or self.new_http(timeouts(read_timeout))
        self.base_url = base_url.rstrip("/")

    def new_http(self, timeout: httpx.Timeout) -> HttpClient:
        """The HTTP client of its own that a client makes when it is not given one."""
        raise NotImplementedError

    def auth_headers(self) -> dict[str, str]:
        raise NotImplementedError

    def build(self, request: Request, *, stream: bool = False) -> httpx.Request:
        """The HTTP request of ``request``, with the credentials if it needs them."""
        auth = self.auth_headers() if request.authenticated else {}
        built = self.http.build_request(
            request.method,
            self.base_url + request.path,
            params=request.params,
            json=request.json,
            headers={**auth, **request.headers},
        )
        if stream:
            built.headers["Accept"] = "text/event-stream"
            built.headers["Cache-Control"] = "no-store"
        return built

    def new_call(self, request: Request) -> Call:
        return Call(request, self.retry)

    def new_session(
        self,
        first: Request,
        user: str | None,
        *,
        followed: str | None,
        after: str | None,
        continue_on_pause: bool,
        from_start: bool = True,
    ) -> StreamSession:
        state = StreamState(
            followed=followed, last_event_id=after, continue_on_pause=continue_on_pause, from_start=from_start
        )
        return StreamSession(self.routes, first, user, state, policy=self.retry, on_reconnect=self.on_reconnect)

    def run_request(self, inputs: Mapping[str, Any], user: str | None, mode: str, key: IdempotencyKey) -> Request:
        return self.routes.run(inputs, user, mode, idempotency_key(key))

    def run_session(
        self, inputs: Mapping[str, Any], user: str | None, continue_on_pause: bool, key: IdempotencyKey
    ) -> StreamSession:
        """A streaming run's stream: its POST first (sent again with the same key until it is
        answered), then the events endpoint once the response headers named the run."""
        first = self.run_request(inputs, user, "streaming", key)
        return self.new_session(first, user, followed=None, after=None, continue_on_pause=continue_on_pause)

    def follow_session(
        self, run_id: str, user: str | None, after: str | None, continue_on_pause: bool, from_start: bool
    ) -> StreamSession:
        first = self.routes.events(
            run_id, user, last_event_id=after, continue_on_pause=continue_on_pause, from_start=from_start
        )
        return self.new_session(
            first, user, followed=run_id, after=after, continue_on_pause=continue_on_pause, from_start=from_start
        )


class ServiceFlavour(ClientBase[HttpClient]):
    """The service API (``/v1``) with an app's API key; the public classes document the arguments."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        retry: RetryPolicy | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        on_reconnect: ReconnectHook | None = None,
        http_client: HttpClient | None = None,
    ) -> None:
        super().__init__(base_url, SERVICE_ROUTES, retry, read_timeout, on_reconnect, http_client)
        self.api_key = api_key

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


class WebFlavour(ClientBase[HttpClient]):
    """The web app (``/api``) of one site, a passport naming the end user; each I/O flavour obtains it."""

    def __init__(
        self,
        base_url: str,
        site_code: str,
        *,
        passport: Passport | None = None,
        retry: RetryPolicy | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        on_reconnect: ReconnectHook | None = None,
        http_client: HttpClient | None = None,
    ) -> None:
        super().__init__(base_url, WEB_ROUTES, retry, read_timeout, on_reconnect, http_client)
        self.site_code = site_code
        self._passport = passport


def first_action(form: HumanInputForm) -> str:
    """The action a submission that names none uses: the form's first."""
    if not form.user_actions:
        raise ProtocolError("the form has no actions to submit it with")
    return form.user_actions[0].id
