"""The Durable Streams HTTP protocol, served from ``api.services.durable_streams_gateway``.

:func:`create_blueprint` builds the blueprint for a prefix: the API mounts it at
``DURABLE_STREAMS_GATEWAY_PREFIX`` and ``api/durable_streams_app.py`` serves it on its own.
"""

from __future__ import annotations

from .blueprint import create_blueprint

__all__ = ["create_blueprint"]
