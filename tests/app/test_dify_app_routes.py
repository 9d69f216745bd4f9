"""The routes Dify's spec lists for a workflow app beyond runs and forms, each answer checked against the
published spec (``tests/app/dify_spec.py``): parameters, info, meta, site, logs, a run of a given
version, file uploads (and files as inputs of runs and forms), end users, speech, other apps' routes."""

from __future__ import annotations

import io
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from werkzeug.datastructures import FileStorage, MultiDict
from werkzeug.test import encode_multipart

from harness.processes import running_worker
from harness.waiting import wait_until
from tests.app import examples
from tests.app.conftest import AppHarness
from tests.app.dify_spec import event_schema, response_schema, spec_errors, validate_spec

GREETING = examples.greeting()
#: A document upload may be at most this many MB in these tests (so that a too large one stays small).
UPLOAD_MB = 1


def file_app() -> dict[str, Any]:
    """An app whose start node takes a file and a list of files, and whose form asks for a file."""
    return {
        "name": "Files",
        "mode": "workflow",
        "graph": {
            "nodes": [
                {
                    "id": "start",
                    "type": "start",
                    "variables": [
                        {"name": "report", "type": "file", "required": True, "label": "Report"},
                        {"name": "photos", "type": "file-list", "number_limits": 2},
                        {"name": "tone", "type": "select", "options": ["dry", "warm"], "default": "dry"},
                    ],
                },
                {
                    "id": "ask",
                    "type": "human_input",
                    "form": [{"name": "signed", "type": "file", "allowed_file_extensions": [".txt"]}],
                },
                {"id": "end", "type": "end", "outputs": {"signed": {"variable": "ask.signed"}}},
            ],
            "edges": [{"source": "start", "target": "ask"}, {"source": "ask", "target": "end"}],
        },
    }


@pytest.fixture(scope="module")
def harness(module_env: dict[str, str]) -> Iterator[AppHarness]:
    """The module's stack, its document uploads limited to ``UPLOAD_MB`` and two extensions refused."""
    env = {**module_env, "UPLOAD_FILE_SIZE_LIMIT": str(UPLOAD_MB), "UPLOAD_FILE_EXTENSION_BLACKLIST": "exe, .bat"}
    with running_worker(env, pathlib.Path(env["VAR_DIR"]) / "routes-worker.log") as worker:
        built = AppHarness(env, worker)
        try:
            yield built
        finally:
            built.close()


@pytest.fixture(scope="module")
def greeting(harness: AppHarness) -> dict[str, str]:
    return harness.create_app("greeting")


def get(harness: AppHarness, path: str, key: str) -> Any:
    return harness.get(f"/v1{path}", key)


def upload(harness: AppHarness, key: str, name: str, data: bytes, mime: str | None = "text/plain", **form: str) -> Any:
    fields: dict[str, Any] = {"user": "u1", **form, "file": FileStorage(io.BytesIO(data), name, content_type=mime)}
    # Encoded in memory: the test client would spool a large body to a temporary file it never closes.
    boundary, body = encode_multipart(MultiDict(fields))
    return harness.client.post(
        "/v1/files/upload",
        data=body,
        content_type=f"multipart/form-data; boundary={boundary}",
        headers={"Authorization": f"Bearer {key}"},
    )


def test_parameters_info_meta_and_site_answer_as_the_spec_says(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    answers = {path: get(harness, path, key) for path in ("/parameters", "/info", "/meta", "/site")}
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.json)
        validate_spec(response_schema("GET", path), answer.json, f"GET {path}")
    parameters = answers["/parameters"].json
    assert parameters["user_input_form"] == [
        {"text-input": {"label": "Name", "variable": "name", "required": True, "default": "", "max_length": 256}},
        {"text-input": {"label": "Mood", "variable": "mood", "required": False, "default": "cheerful"}},
    ]
    assert parameters["speech_to_text"] == {"enabled": False} and parameters["file_upload"]["image"]["enabled"] is False
    assert parameters["system_parameters"]["file_size_limit"] == UPLOAD_MB
    assert answers["/info"].json == {
        "name": "Greeting with approval",
        "description": "",
        "tags": [],
        "mode": "workflow",
        "author_name": "",
    }
    assert answers["/meta"].json == {"tool_icons": {}}
    assert answers["/site"].json["title"] == "Greeting with approval"
    assert get(harness, "/parameters", "app-nope").status_code == 401


def test_a_run_of_the_app_s_version_and_of_others(harness: AppHarness, greeting: dict[str, str]) -> None:
    key, app_id = greeting["api_key"], greeting["app_id"]
    body = {"inputs": {"name": "Ada"}, "user": "u1", "response_mode": "blocking"}
    ran = harness.post(f"/v1/workflows/{app_id}/run", key, body)
    assert ran.status_code == 200 and ran.json["data"]["status"] == "succeeded", ran.json
    validate_spec(response_schema("POST", "/workflows/{workflow_id}/run"), ran.json, "the blocking answer")
    assert ran.json["data"]["workflow_id"] == app_id
    other = harness.post(f"/v1/workflows/{uuid.uuid4()}/run", key, body)
    assert (other.status_code, other.json["code"]) == (404, "not_found")
    malformed = harness.post("/v1/workflows/not-a-version/run", key, body)
    assert (malformed.status_code, malformed.json["code"]) == (400, "bad_request")


def test_logs_are_the_runs_paged_and_filtered(harness: AppHarness) -> None:
    key = harness.create_app("greeting")["api_key"]
    before = time.time()
    runs = [
        harness.post("/v1/workflows/run", key, {"inputs": {"name": name}, "user": user}).json
        for name, user in (("Ada", "alice"), ("Bob", "bob"), ("Cy", "alice"))
    ]
    paused = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Di", "mood": "formal"}, "user": "bob"}).json
    assert paused["data"]["status"] == "paused"
    schema = response_schema("GET", "/workflows/logs")

    def logs(query: str = "") -> dict[str, Any]:
        answer = get(harness, f"/workflows/logs{query}", key)
        assert answer.status_code == 200, answer.json
        validate_spec(schema, answer.json, f"GET /workflows/logs{query}")
        body: dict[str, Any] = answer.json
        return body

    everything = logs()
    assert (everything["page"], everything["limit"], everything["total"], everything["has_more"]) == (1, 20, 4, False)
    ids = [item["workflow_run"]["id"] for item in everything["data"]]
    assert ids == [paused["workflow_run_id"], *[run["workflow_run_id"] for run in reversed(runs)]], "newest first"
    first = everything["data"][-1]
    assert first["created_by_role"] == "end_user" and first["created_by_end_user"]["session_id"] == "alice"
    assert first["workflow_run"]["status"] == "succeeded" and first["workflow_run"]["total_steps"] == 4
    page = logs("?page=2&limit=3")
    assert (page["total"], page["has_more"], len(page["data"])) == (4, False, 1)
    assert logs("?limit=3")["has_more"] is True
    assert logs("?status=paused")["total"] == 1
    assert logs("?created_by_end_user_session_id=alice")["total"] == 2
    assert [item["workflow_run"]["id"] for item in logs("?keyword=Cy")["data"]] == [runs[2]["workflow_run_id"]]
    after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before - 60))
    assert logs(f"?created_at__after={after}")["total"] == 4 and logs("?created_at__before=2001-01-01")["total"] == 0
    for query in ("?page=0", "?limit=101", "?limit=x", "?status=lost", "?created_at__before=yesterday"):
        refused = get(harness, f"/workflows/logs{query}", key)
        assert (refused.status_code, refused.json["code"]) == (400, "invalid_param"), query
    account = get(harness, "/workflows/logs?created_by_account=a@b.c", key)
    assert (account.status_code, account.json["message"]) == (400, "Account not found: a@b.c")


def test_uploads_keep_to_dify_s_limits(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    stored = upload(harness, key, "notes.txt", b"hello")
    assert stored.status_code == 201, stored.json
    validate_spec(response_schema("POST", "/files/upload", 201), stored.json, "the upload's answer")
    assert (stored.json["name"], stored.json["size"], stored.json["extension"]) == ("notes.txt", 5, "txt")
    preview = harness.get(f"/v1/files/{stored.json['id']}/preview", key)
    assert preview.status_code == 200 and preview.data == b"hello"
    preview.close()  # the response holds the stored file open until it is closed
    other_app = harness.create_app("greeting")["api_key"]
    assert harness.get(f"/v1/files/{stored.json['id']}/preview", other_app).status_code == 404

    headers = {"Authorization": f"Bearer {key}"}
    refused = {
        "no file": (harness.client.post("/v1/files/upload", data={"user": "u1"}, headers=headers), 400),
        "two files": (
            harness.client.post(
                "/v1/files/upload",
                data={"user": "u1", "file": [(io.BytesIO(b"a"), "a.txt"), (io.BytesIO(b"b"), "b.txt")]},
                headers=headers,
            ),
            400,
        ),
        "no user": (upload(harness, key, "a.txt", b"a", user=""), 400),
        "blacklisted": (upload(harness, key, "tool.EXE", b"MZ"), 400),
        "no name": (upload(harness, key, "", b"a"), 400),
        "too large": (upload(harness, key, "big.txt", b"x" * (UPLOAD_MB * 1024 * 1024 + 1)), 413),
        "no type": (
            harness.client.post(
                "/v1/files/upload",
                data=(
                    b'--b\r\nContent-Disposition: form-data; name="user"\r\n\r\nu1\r\n'
                    b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\nabc\r\n--b--\r\n'
                ),
                content_type="multipart/form-data; boundary=b",
                headers=headers,
            ),
            415,
        ),
    }
    codes = {
        "no file": "no_file_uploaded",
        "two files": "too_many_files",
        "no user": "invalid_param",
        "blacklisted": "invalid_param",
        "no name": "filename_not_exists_error",
        "too large": "file_too_large",
        "no type": "unsupported_file_type",
    }
    for what, (answer, status) in refused.items():
        assert (answer.status_code, answer.json["code"]) == (status, codes[what]), (what, answer.json)
    # A picture may be larger than a document: each category has its own limit.
    picture = upload(harness, key, "big.png", b"x" * (UPLOAD_MB * 1024 * 1024 + 1), "image/png")
    assert picture.status_code == 201 and picture.json["extension"] == "png"


def test_uploads_are_file_inputs_of_runs_and_forms(harness: AppHarness) -> None:
    key = harness.create_app(file_app())["api_key"]
    report = upload(harness, key, "report.pdf", b"%PDF", "application/pdf").json
    signed = upload(harness, key, "signed.txt", b"ok").json
    local = {"type": "document", "transfer_method": "local_file", "upload_file_id": report["id"]}
    photo = {"type": "image", "transfer_method": "remote_url", "url": "https://example.invalid/p.png"}
    inputs = {"report": local, "photos": [photo]}
    paused = harness.post("/v1/workflows/run", key, {"inputs": inputs, "user": "u1"}).json
    assert paused["data"]["status"] == "paused", paused
    started = harness.events(paused["workflow_run_id"])[0]["data"]["inputs"]
    assert started["report"] == {
        **local,
        "filename": "report.pdf",
        "extension": ".pdf",
        "mime_type": "application/pdf",
        "size": 4,
    }
    assert started["photos"] == [{**photo, "filename": "p.png", "extension": ".png"}]

    bad = [
        {"report": {**local, "upload_file_id": str(uuid.uuid4())}},
        {"report": "report.pdf"},
        {"report": local, "photos": [photo] * 3},
    ]
    for wrong in bad:
        refused = harness.post("/v1/workflows/run", key, {"inputs": wrong, "user": "u1"})
        assert (refused.status_code, refused.json["code"]) == (400, "invalid_param"), wrong

    token = paused["data"]["reasons"][0]["form_token"]
    form = f"/v1/form/human_input/{token}"
    answer = {"action": "submit", "user": "u1"}
    wrong_type = {"signed": {"type": "document", "transfer_method": "local_file", "upload_file_id": report["id"]}}
    refused = harness.post(form, key, {**answer, "inputs": wrong_type})
    assert (refused.status_code, refused.json["code"]) == (400, "invalid_form_data"), refused.json
    unknown = {"signed": {"type": "document", "transfer_method": "local_file", "upload_file_id": str(uuid.uuid4())}}
    refused = harness.post(form, key, {**answer, "inputs": unknown})
    assert (refused.status_code, refused.json["code"]) == (400, "invalid_form_data"), refused.json
    file = {"type": "document", "transfer_method": "local_file", "upload_file_id": signed["id"]}
    assert harness.post(form, key, {**answer, "inputs": {"signed": file}}).status_code == 200

    def finished() -> dict[str, Any] | None:
        detail = harness.get(f"/v1/workflows/run/{paused['workflow_run_id']}", key).json
        return detail if detail["status"] == "succeeded" else None

    outputs = wait_until(finished, 30, "the resumed run to succeed")["outputs"]
    assert outputs["signed"]["filename"] == "signed.txt" and outputs["signed"]["upload_file_id"] == signed["id"]


def test_end_users_are_known_by_the_id_runs_name_them_by(harness: AppHarness, greeting: dict[str, str]) -> None:
    key = greeting["api_key"]
    ran = harness.post("/v1/workflows/run", key, {"inputs": {"name": "Ada"}, "user": "end-user-7"}).json
    created_by = ran["data"]["created_by"]
    assert created_by["user"] == "end-user-7"
    answer = get(harness, f"/end-users/{created_by['id']}", key)
    assert answer.status_code == 200, answer.json
    validate_spec(response_schema("GET", "/end-users/{end_user_id}"), answer.json, "the end user")
    assert (answer.json["session_id"], answer.json["app_id"]) == ("end-user-7", greeting["app_id"])
    finished = harness.events(ran["workflow_run_id"])[-1]
    assert finished["data"]["created_by"] == created_by
    assert not spec_errors(event_schema("workflow_finished"), finished)
    for unknown in (str(uuid.uuid4()), "nope"):
        missing = get(harness, f"/end-users/{unknown}", key)
        assert (missing.status_code, missing.json["code"]) == (404, "end_user_not_found")
    other_app = harness.create_app("greeting")["api_key"]
    assert get(harness, f"/end-users/{created_by['id']}", other_app).status_code == 404


def test_speech_and_other_apps_routes_answer_as_dify_does_for_a_workflow_app(
    harness: AppHarness, greeting: dict[str, str]
) -> None:
    key = greeting["api_key"]
    headers = {"Authorization": f"Bearer {key}"}

    def audio(mime: str) -> Any:
        data = {"user": "u1", "file": (io.BytesIO(b"ID3"), "a.mp3", mime)}
        return harness.client.post("/v1/audio-to-text", data=data, headers=headers)

    cases = [
        (audio("audio/mpeg"), 400, "speech_to_text_disabled"),
        (audio("text/plain"), 415, "unsupported_audio_type"),
        (harness.client.post("/v1/audio-to-text", data={"user": "u1"}, headers=headers), 400, "no_audio_uploaded"),
        (harness.post("/v1/text-to-audio", key, {"text": "hi", "user": "u1"}), 400, "invalid_param"),
        (harness.post("/v1/chat-messages", key, {"query": "hi", "inputs": {}, "user": "u1"}), 400, "not_chat_app"),
        (harness.get("/v1/conversations?user=u1", key), 400, "not_chat_app"),
        (harness.post("/v1/chat-messages/t/stop", key, {"user": "u1"}), 400, "not_chat_app"),
        (harness.post("/v1/completion-messages", key, {"inputs": {}, "user": "u1"}), 400, "app_unavailable"),
    ]
    for answer, status, code in cases:
        assert (answer.status_code, answer.json["code"]) == (status, code), answer.json
    assert harness.post("/v1/chat-messages", "app-nope", {}).status_code == 401
