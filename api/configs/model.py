"""Every setting in one pydantic-settings model: ours (:mod:`.service`, :mod:`.limits`, :mod:`.operations`) and
Dify's (:mod:`.dify`).

Read from the environment and an optional ``.env`` file in the working directory; an empty value
counts as unset (Dify's ``.env.example`` leaves many settings empty). Which settings were given at
all is ``model_fields_set``: :mod:`api.configs.resolve` tells "set to Dify's default" from "not set".
"""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from .dify import DifySettings
from .limits import LimitSettings
from .operations import OperationsSettings
from .service import ServiceSettings

__all__ = ["Settings"]


class Settings(ServiceSettings, DifySettings, LimitSettings, OperationsSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", env_ignore_empty=True, populate_by_name=True)

    def given(self, name: str) -> bool:
        """Whether the setting ``name`` was set (environment, ``.env`` or an argument), to anything but empty."""
        if name not in self.model_fields_set:
            return False
        value = getattr(self, name)
        return value is not None and value != ""

    @property
    def development(self) -> bool:
        return self.DEPLOY_ENV == "DEVELOPMENT"
