"""What a gateway operation refuses with: a protocol status, a message and the headers it needs."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["GatewayError"]


class GatewayError(Exception):
    """A request the protocol answers with ``status`` (never a 500: every refusal is one of these)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def bad_request(message: str) -> GatewayError:
    return GatewayError(400, message)


def not_found(message: str = "stream not found") -> GatewayError:
    return GatewayError(404, message)


def gone(message: str) -> GatewayError:
    return GatewayError(410, message)


def conflict(message: str, headers: Mapping[str, str] | None = None) -> GatewayError:
    return GatewayError(409, message, headers)


def unavailable(message: str = "the stream store is unavailable; try again shortly") -> GatewayError:
    return GatewayError(503, message, {"Retry-After": "1"})
