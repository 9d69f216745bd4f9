"""What Dify's service API says of an app itself: ``/parameters``, ``/info``, ``/meta``, ``/site``.

A workflow app here has no chat features, speech, annotations or moderation: they are all answered
disabled, as Dify answers them for a workflow app that does not use them. Its inputs are the start
node's variables, in Dify's ``user_input_form`` shape (one ``{"<control type>": {...}}`` per input).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from flask import current_app

from api.configs import AppConfig
from api.core.workflow import Graph
from api.models import App

#: How a start variable's ``type`` is shown (Dify's control types); a variable without one is text.
_CONTROLS = {
    None: "text-input",
    "text": "text-input",
    "text-input": "text-input",
    "paragraph": "paragraph",
    "select": "select",
    "number": "number",
    "checkbox": "checkbox",
    "file": "file",
    "file-list": "file-list",
    "json_object": "json_object",
}
#: Dify's limit on files per run input.
WORKFLOW_FILE_UPLOAD_LIMIT = 10
_OFF = {"enabled": False}


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def user_input_form(app: App) -> list[dict[str, Any]]:
    """The start node's variables as Dify's ``user_input_form``."""
    form = []
    for variable in Graph(app.graph).start.config.get("variables", []):
        control = _CONTROLS.get(variable.get("type"), "text-input")
        shown: dict[str, Any] = {
            "label": str(variable.get("label") or variable["name"]),
            "variable": variable["name"],
            "required": bool(variable.get("required", False)),
            "default": "" if variable.get("default") is None else variable["default"],
        }
        if control in ("text-input", "paragraph") and isinstance(variable.get("max_length"), int):
            shown["max_length"] = variable["max_length"]
        if control == "select":
            shown["options"] = [str(option) for option in variable.get("options") or []]
        if control in ("file", "file-list"):
            for key in ("allowed_file_types", "allowed_file_extensions", "allowed_file_upload_methods"):
                shown[key] = list(variable.get(key) or [])
            if control == "file-list":
                shown["max_length"] = int(variable.get("number_limits") or WORKFLOW_FILE_UPLOAD_LIMIT)
        form.append({control: shown})
    return form


def parameters(app: App) -> dict[str, Any]:
    """``GET /parameters`` (``AppParametersResponse``)."""
    config = _config()
    return {
        "opening_statement": "",
        "suggested_questions": [],
        "suggested_questions_after_answer": dict(_OFF),
        "speech_to_text": dict(_OFF),
        "text_to_speech": {"enabled": False, "voice": "", "language": "", "autoPlay": "disabled"},
        "retriever_resource": dict(_OFF),
        "annotation_reply": dict(_OFF),
        "more_like_this": dict(_OFF),
        "sensitive_word_avoidance": dict(_OFF),
        "user_input_form": user_input_form(app),
        "file_upload": {
            "image": {
                "enabled": False,
                "number_limits": 3,
                "detail": "high",
                "transfer_methods": ["remote_url", "local_file"],
            }
        },
        "system_parameters": {
            "file_size_limit": config.UPLOAD_FILE_SIZE_LIMIT,
            "image_file_size_limit": config.UPLOAD_IMAGE_FILE_SIZE_LIMIT,
            "audio_file_size_limit": config.UPLOAD_AUDIO_FILE_SIZE_LIMIT,
            "video_file_size_limit": config.UPLOAD_VIDEO_FILE_SIZE_LIMIT,
            "workflow_file_upload_limit": WORKFLOW_FILE_UPLOAD_LIMIT,
        },
    }


def _description(app: App) -> str:
    description = app.graph.get("description") if isinstance(app.graph, Mapping) else None
    return description if isinstance(description, str) else ""


def info(app: App) -> dict[str, Any]:
    """``GET /info`` (``AppInfoResponse``)."""
    return {"name": app.name, "description": _description(app), "tags": [], "mode": app.mode, "author_name": ""}


def meta(app: App) -> dict[str, Any]:
    """``GET /meta``: the icons of the tools the app uses (none: this engine has no tool nodes)."""
    return {"tool_icons": {}}


def site(app: App) -> dict[str, Any]:
    """``GET /site`` (``WebAppSettingsResponse``): the web app's settings, Dify's defaults but the title."""
    return {
        "title": app.name,
        "chat_color_theme": "",
        "chat_color_theme_inverted": False,
        "icon_type": "emoji",
        "icon": "🤖",
        "icon_background": "#FFEAD5",
        "icon_url": None,
        "description": _description(app),
        "copyright": "",
        "privacy_policy": "",
        "input_placeholder": None,
        "custom_disclaimer": "",
        "default_language": "en-US",
        "show_workflow_steps": True,
        "use_icon_as_answer_icon": False,
    }


def version(app: App) -> str:
    """The app's one published workflow version, as Dify names versions (its time)."""
    created = app.created_at if app.created_at.tzinfo else app.created_at.replace(tzinfo=datetime.UTC)
    return created.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
