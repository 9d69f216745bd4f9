"""The resume-token codec (``RESUME_TOKEN_KEYS``), built once when the app is created.

Without configured keys a development key is derived from ``SECRET_KEY``; see README.md.
"""

from __future__ import annotations

from flask import Flask, current_app

from api.configs import AppConfig
from api.libs.resume_token import ResumeTokenCodec, development_key, parse_keys

EXTENSION_KEY = "resume_tokens"


def init_app(app: Flask, config: AppConfig) -> None:
    keys = parse_keys(config.RESUME_TOKEN_KEYS) or [development_key(config.SECRET_KEY)]
    app.extensions[EXTENSION_KEY] = ResumeTokenCodec(keys)


def resume_token_codec() -> ResumeTokenCodec:
    codec: ResumeTokenCodec = current_app.extensions[EXTENSION_KEY]
    return codec
