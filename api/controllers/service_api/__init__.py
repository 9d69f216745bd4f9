"""The service API (``/v1``), authenticated with an app's API key."""

from __future__ import annotations

from . import app, files, workflow  # noqa: F401  (registers the resources)
from .blueprint import bp

__all__ = ["bp"]
