"""Uploaded files (Dify's ``POST /files/upload``): stored by the storage setting, with Dify's size and
type limits, and resolved when a run's input or a form's answer names one (``local_file``).

The storage is a local folder (``STORAGE_LOCAL_PATH``, by default ``VAR_DIR/storage``): every API
process of a deployment must see the same one (a shared volume), as Dify's ``opendal`` local storage.
"""

from __future__ import annotations

import datetime
import pathlib
import posixpath
import uuid
from collections.abc import Mapping
from typing import IO, Any

from flask import current_app

from api.configs import AppConfig
from api.libs.errors import InvalidParamError, NotFoundError, ServiceError
from api.models import App, UploadFile
from api.models.engine import db

from . import end_user_service
from .validation import could_be_our_id

#: Dify's file categories by extension; anything else is ``custom`` (and sized as a document).
CATEGORIES: dict[str, frozenset[str]] = {
    "image": frozenset({"jpg", "jpeg", "png", "webp", "gif", "svg"}),
    "video": frozenset({"mp4", "mov", "mpeg", "webm"}),
    "audio": frozenset({"mp3", "m4a", "wav", "amr", "mpga"}),
    "document": frozenset(
        {
            "txt", "markdown", "md", "mdx", "pdf", "html", "htm", "xlsx", "xls", "vtt", "properties",
            "doc", "docx", "csv", "eml", "msg", "pptx", "ppt", "xml", "epub",
        }
    ),
}  # fmt: skip
_MB = 1024 * 1024
_CHUNK = 1 << 16


class FileTooLargeError(ServiceError):
    status = 413
    code = "file_too_large"


class UnsupportedFileTypeError(ServiceError):
    status = 415
    code = "unsupported_file_type"


def _config() -> AppConfig:
    config: AppConfig = current_app.config["APP_CONFIG"]
    return config


def storage_root(config: AppConfig) -> pathlib.Path:
    return config.STORAGE_LOCAL_PATH or config.VAR_DIR / "storage"


def category(extension: str) -> str:
    """Dify's file type of an extension (without its dot): image, video, audio, document or custom."""
    return next((name for name, known in CATEGORIES.items() if extension in known), "custom")


def size_limit(config: AppConfig, kind: str) -> int:
    """Bytes a file of this category may have."""
    megabytes = {
        "image": config.UPLOAD_IMAGE_FILE_SIZE_LIMIT,
        "video": config.UPLOAD_VIDEO_FILE_SIZE_LIMIT,
        "audio": config.UPLOAD_AUDIO_FILE_SIZE_LIMIT,
    }.get(kind, config.UPLOAD_FILE_SIZE_LIMIT)
    return megabytes * _MB


def largest_upload(config: AppConfig) -> int:
    """The largest request body ``POST /files/upload`` may need: the largest file and its envelope."""
    kinds = ("image", "video", "audio", "document")
    return max(size_limit(config, kind) for kind in kinds) + _MB


def upload(app: App, user: str, name: str | None, mime_type: str | None, stream: IO[bytes]) -> UploadFile:
    """Store an uploaded file for ``user`` of ``app``.

    Raises:
        InvalidParamError: (400 ``filename_not_exists_error``) no file name; (400 ``invalid_param``) a name
            with ``/`` or ``\\``, or an extension of ``UPLOAD_FILE_EXTENSION_BLACKLIST``.
        UnsupportedFileTypeError: (415 ``unsupported_file_type``) the part declares no MIME type.
        FileTooLargeError: (413 ``file_too_large``) the file is over its category's limit.
    """
    if not name:
        raise InvalidParamError("The uploaded file has no filename.", code="filename_not_exists_error")
    if "/" in name or "\\" in name or len(name) > 255:
        raise InvalidParamError("the file name must not contain '/' or '\\' (at most 255 characters)")
    if not mime_type:
        raise UnsupportedFileTypeError("File type not allowed.")
    config = _config()
    extension = posixpath.splitext(name)[1].lstrip(".").lower()
    blacklist = {item.strip().lstrip(".").lower() for item in config.UPLOAD_FILE_EXTENSION_BLACKLIST.split(",")}
    if extension and extension in blacklist:
        raise InvalidParamError(f"files with the extension .{extension} are not allowed")
    limit = size_limit(config, category(extension))
    file_id = str(uuid.uuid4())
    key = f"upload_files/{app.id}/{file_id}" + (f".{extension}" if extension.isalnum() else "")
    path = storage_root(config) / key
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    try:
        with open(path, "wb") as out:
            while chunk := stream.read(_CHUNK):
                size += len(chunk)
                if size > limit:
                    # Dify's known quirk: this answer's message is empty.
                    raise FileTooLargeError("")
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    user_id = end_user_service.ensure(app, user)
    row = UploadFile(
        id=file_id,
        app_id=app.id,
        end_user_id=user_id,
        name=name,
        size=size,
        extension=extension[:32],
        mime_type=mime_type[:255],
        key=key,
    )
    db.session.add(row)
    try:
        db.session.commit()
    except BaseException:
        db.session.rollback()
        path.unlink(missing_ok=True)
        raise
    return row


def describe(row: UploadFile, base_url: str) -> dict[str, Any]:
    """``FileUploadResponse``: what Dify answers an upload with."""
    return {
        "id": row.id,
        "reference": None,
        "name": row.name,
        "size": row.size,
        "extension": row.extension or None,
        "mime_type": row.mime_type,
        "created_by": row.end_user_id,
        "created_at": int(_timestamp(row)),
        "preview_url": None,
        "source_url": f"{base_url}/files/{row.id}/preview",
        "original_url": None,
        "user_id": None,
        "tenant_id": None,
        "conversation_id": None,
        "file_key": None,
    }


def _timestamp(row: UploadFile) -> float:
    created = row.created_at
    # SQLite hands back naive datetimes even for timezone-aware columns.
    return (created if created.tzinfo else created.replace(tzinfo=datetime.UTC)).timestamp()


def get_file(app: App, file_id: str) -> UploadFile:
    """The app's uploaded file ``file_id``.

    Raises:
        NotFoundError: (404 ``file_not_found``) no such file of this app.
    """
    row = db.session.get(UploadFile, file_id) if could_be_our_id(file_id) else None
    if row is None or row.app_id != app.id:
        raise NotFoundError("File not found.", code="file_not_found")
    return row


def path_of(row: UploadFile) -> pathlib.Path:
    return storage_root(_config()) / row.key


def resolve(app: App, value: Any, where: str) -> dict[str, Any]:
    """A file input (``{"type", "transfer_method", "upload_file_id" | "url"}``) with what is known of it:
    an uploaded file's name, extension (with its dot), MIME type and size; an URL's name and extension.

    Raises:
        InvalidParamError: not a file mapping, or an upload this app does not have (``where`` names it).
    """
    if not isinstance(value, Mapping):
        raise InvalidParamError(f"{where} must be a file object")
    resolved = dict(value)
    method = value.get("transfer_method")
    if method == "local_file":
        upload_id = value.get("upload_file_id")
        if not isinstance(upload_id, str) or not could_be_our_id(upload_id):
            raise InvalidParamError(f"{where}: a local_file needs the upload_file_id of an uploaded file")
        row = db.session.get(UploadFile, upload_id)
        if row is None or row.app_id != app.id:
            raise InvalidParamError(f"{where}: no uploaded file {upload_id!r}")
        resolved.update(
            filename=row.name,
            extension=f".{row.extension}" if row.extension else "",
            mime_type=row.mime_type,
            size=row.size,
        )
        resolved.setdefault("type", category(row.extension))
    elif method == "remote_url":
        url = value.get("url")
        if isinstance(url, str):
            name = posixpath.basename(url.split("?", 1)[0].split("#", 1)[0])
            resolved.setdefault("filename", name)
            resolved.setdefault("extension", posixpath.splitext(name)[1].lower())
    else:
        raise InvalidParamError(f"{where}: transfer_method must be local_file or remote_url")
    return resolved


__all__ = [
    "CATEGORIES",
    "FileTooLargeError",
    "UnsupportedFileTypeError",
    "category",
    "describe",
    "get_file",
    "largest_upload",
    "path_of",
    "resolve",
    "size_limit",
    "storage_root",
    "upload",
]
