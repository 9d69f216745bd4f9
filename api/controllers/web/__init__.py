"""The web app API (``/api``): end users of a published app, authenticated by a passport token."""

from __future__ import annotations

from . import passport, workflow  # noqa: F401  (registers the resources)
from .blueprint import bp

__all__ = ["bp"]
