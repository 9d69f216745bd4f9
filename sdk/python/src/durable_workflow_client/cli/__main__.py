from __future__ import annotations

from .main import console_script

console_script()
