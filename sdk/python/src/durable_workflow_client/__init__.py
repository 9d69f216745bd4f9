"""Python client for durable workflow event streams: start runs, stream their events, resume by itself.

Quick start::

    from durable_workflow_client import Client, WorkflowFinished

    with Client("http://127.0.0.1:5001", "app-…") as client:
        for event in client.run({"name": "Ada"}, user="me"):
            print(event.event)

See the package's README for the whole API.
"""

from __future__ import annotations

from .async_client import AsyncClient, AsyncEventStream, AsyncWebClient
from .common import ReconnectInfo
from .errors import (
    ApiError,
    AuthenticationError,
    ClientError,
    ConflictError,
    ConnectionLostError,
    EventsGoneError,
    FormClosedError,
    FormExpiredError,
    FormSubmittedError,
    IdempotencyKeyReusedError,
    InvalidFormDataError,
    InvalidRequestError,
    InvalidResumeTokenError,
    NotFoundError,
    ProtocolError,
    RequestTooLargeError,
    ServiceUnavailableError,
)
from .events import (
    Event,
    HumanInputFormFilled,
    HumanInputFormTimeout,
    HumanInputRequired,
    NodeFinished,
    NodeStarted,
    TextChunk,
    UnknownEvent,
    WorkflowFinished,
    WorkflowPaused,
    WorkflowStarted,
    parse_event,
)
from .forms import FormAction, FormInput, HumanInputForm, PauseReason
from .models import HumanInputAccepted, Passport, RunDetail, RunHandle, RunOutcome
from .retry import RetryPolicy
from .sync_client import Client, EventStream, WebClient

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncEventStream",
    "AsyncWebClient",
    "AuthenticationError",
    "Client",
    "ClientError",
    "ConflictError",
    "ConnectionLostError",
    "Event",
    "EventStream",
    "EventsGoneError",
    "FormAction",
    "FormClosedError",
    "FormExpiredError",
    "FormInput",
    "FormSubmittedError",
    "HumanInputAccepted",
    "HumanInputForm",
    "HumanInputFormFilled",
    "HumanInputFormTimeout",
    "HumanInputRequired",
    "IdempotencyKeyReusedError",
    "InvalidFormDataError",
    "InvalidRequestError",
    "InvalidResumeTokenError",
    "NodeFinished",
    "NodeStarted",
    "NotFoundError",
    "Passport",
    "PauseReason",
    "ProtocolError",
    "ReconnectInfo",
    "RequestTooLargeError",
    "RetryPolicy",
    "RunDetail",
    "RunHandle",
    "RunOutcome",
    "ServiceUnavailableError",
    "TextChunk",
    "UnknownEvent",
    "WebClient",
    "WorkflowFinished",
    "WorkflowPaused",
    "WorkflowStarted",
    "__version__",
    "parse_event",
]
