"""``POST /files/upload`` (a file for a run's or a form's file input), its preview, and Dify's speech
routes, answered as Dify answers them when the app has no speech model."""

from __future__ import annotations

from typing import Any

from flask import request, send_file
from flask_restful import Resource

from api.libs.errors import InvalidParamError, ServiceError
from api.models import App
from api.services import file_service
from api.services.validation import require_user

from .blueprint import api
from .wraps import validate_app_token

#: Dify's speech limits: what ``/audio-to-text`` takes, before it finds no speech model.
AUDIO_MIME_TYPES = frozenset(
    {"audio/mp3", "audio/mp4", "audio/mpeg", "audio/x-wav", "audio/wav", "audio/webm", "audio/amr", "audio/mpga"}
)
AUDIO_LIMIT = 30 * 1024 * 1024


class _MediaError(ServiceError):
    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message, code=code)
        self.status = status


class FileUploadApi(Resource):  # type: ignore[misc]
    """One ``file`` part and the ``user`` form field, as Dify takes them; 201 with the stored file."""

    @validate_app_token
    def post(self, app_model: App) -> Any:
        files = request.files
        if "file" not in files:
            raise InvalidParamError("Please upload your file.", code="no_file_uploaded")
        if len(files) > 1 or len(files.getlist("file")) > 1:
            raise InvalidParamError("Only one file is allowed.", code="too_many_files")
        user = require_user(request.form.get("user"))
        part = files["file"]
        row = file_service.upload(app_model, user, part.filename, part.mimetype, part.stream)
        return file_service.describe(row, request.host_url.rstrip("/") + "/v1"), 201


class FilePreviewApi(Resource):  # type: ignore[misc]
    """``GET /files/<id>/preview``: an uploaded file's bytes (``?as_attachment=true`` to download)."""

    @validate_app_token
    def get(self, app_model: App, file_id: str) -> Any:
        row = file_service.get_file(app_model, file_id)
        attachment = request.args.get("as_attachment", "").lower() == "true"
        return send_file(
            file_service.path_of(row), mimetype=row.mime_type, as_attachment=attachment, download_name=row.name
        )


class AudioToTextApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def post(self, app_model: App) -> Any:
        part = request.files.get("file")
        if part is None:
            raise InvalidParamError("Please upload your audio.", code="no_audio_uploaded")
        if part.mimetype not in AUDIO_MIME_TYPES:
            raise _MediaError("Audio type not allowed.", status=415, code="unsupported_audio_type")
        if len(part.stream.read(AUDIO_LIMIT + 1)) > AUDIO_LIMIT:
            raise _MediaError("Audio size larger than 30 mb", status=413, code="audio_too_large")
        raise InvalidParamError("Speech to text is not enabled", code="speech_to_text_disabled")


class TextToAudioApi(Resource):  # type: ignore[misc]
    @validate_app_token
    def post(self, app_model: App) -> Any:
        raise InvalidParamError("Text to speech is not enabled")


api.add_resource(FileUploadApi, "/files/upload")
api.add_resource(FilePreviewApi, "/files/<string:file_id>/preview")
api.add_resource(AudioToTextApi, "/audio-to-text")
api.add_resource(TextToAudioApi, "/text-to-audio")
