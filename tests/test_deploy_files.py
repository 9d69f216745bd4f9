"""docker-compose.yaml cannot run here (no Docker engine); keep it consistent with the settings."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import Any

from api.configs import AppConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_compose_uses_only_known_settings_and_real_entry_points() -> None:
    text = (ROOT / "docker" / "docker-compose.yaml").read_text()
    block = text.split("x-app-env: &app-env", 1)[1].split("\n\n", 1)[0]
    names = re.findall(r"^\s+([A-Z_]+):", block, flags=re.M)
    assert names and set(names) <= set(AppConfig.model_fields), set(names) - set(AppConfig.model_fields)
    assert "api.app:app" in text and "api.celery_entrypoint:celery" in text
    assert (ROOT / "api" / "app.py").exists() and (ROOT / "api" / "celery_entrypoint.py").exists()


def test_bin_run_and_compose_use_the_gunicorn_config() -> None:
    # api/gunicorn_conf.py sets worker_connections from WEB_WORKER_CONNECTIONS and freezes the GC.
    for path in (ROOT / "bin" / "run", ROOT / "docker" / "docker-compose.yaml"):
        text = path.read_text()
        assert "python:api.gunicorn_conf" in text and "WEB_WORKER_CONNECTIONS" in text, path
    import api.gunicorn_conf as conf

    assert conf.worker_connections >= 10000 and callable(conf.post_worker_init)


#: PromQL's own words, which a dashboard query may use besides metric and label names.
PROMQL_WORDS = {
    "sum", "by", "without", "rate", "increase", "irate", "histogram_quantile", "clamp_min", "clamp_max",
    "avg", "max", "min", "count", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "le", "topk", "bottomk", "abs", "delta", "deriv", "offset",
}  # fmt: skip


def test_every_dashboard_query_names_metrics_the_app_exports_with_their_labels() -> None:
    import json

    from api.libs.metrics import METRICS, exported_names

    dashboard = json.loads((ROOT / "docker" / "grafana" / "dashboard.json").read_text())
    exported = exported_names()
    labels = {label for metric in METRICS for label in metric.labels}
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(expressions) >= 12
    used: set[str] = set()
    for expression in expressions:
        # Strings ("expired"), durations ([5m]) and numbers (1e-9) are not names.
        bare = re.sub(r'"[^"]*"|\[[^]]*\]|\b\d[\d.]*(?:e[-+]?\d+)?\b', "", expression)
        words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
        metrics = {word for word in words if word not in PROMQL_WORDS and word not in labels}
        assert metrics, f"{expression!r} names no metric"
        assert metrics <= exported, f"{expression!r}: {metrics - exported} is not exported"
        used |= metrics
    wanted = {
        "workflow_sse_streams_open",
        "workflow_sse_resumes_total",
        "workflow_event_delivery_lag_seconds_bucket",
        "durable_stream_appends_total",
        "durable_stream_unavailable_total",
        # The API's requests (rate, 5xx share, latency), the gateway's, and whether workers consume.
        "workflow_http_requests_total",
        "workflow_http_request_seconds_bucket",
        "durable_streams_gateway_requests_total",
        "durable_streams_gateway_request_seconds_bucket",
        "workflow_worker_heartbeats_total",
    }
    assert wanted <= used, wanted - used
    prometheus = (ROOT / "docker" / "prometheus" / "prometheus.yml").read_text()
    assert "api:9101" in prometheus and "worker:9102" in prometheus


def _compose() -> dict[str, Any]:
    import yaml

    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker" / "docker-compose.yaml").read_text())
    return loaded


def _settings() -> set[str]:
    names = set(AppConfig.model_fields)
    for field in AppConfig.model_fields.values():
        alias = field.validation_alias
        names.update(choice for choice in getattr(alias, "choices", ()) if isinstance(choice, str))
    return names


def test_compose_services_healthchecks_and_startup_order() -> None:
    services = _compose()["services"]
    assert set(services) == {"redis", "nats", "postgres", "api", "worker", "beat", "prometheus", "grafana"}
    assert {name: service.get("profiles") for name, service in services.items() if service.get("profiles")} == {
        "nats": ["nats"],
        "prometheus": ["monitoring"],
        "grafana": ["monitoring"],
    }
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test")
        assert isinstance(test, list) and test[0] == "CMD" and len(test) > 1, f"{name} has no healthcheck"
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, (name, dependency)
            assert condition == {"condition": "service_healthy"}, f"{name} starts before {dependency} is healthy"
    for name in ("api", "worker", "beat"):
        assert {"redis", "postgres"} <= set(services[name]["depends_on"]), name
    assert "-k" in services["api"]["command"] and "gevent" in services["api"]["command"]
    assert services["api"]["command"][:3] == ["gunicorn", "--config", "python:api.gunicorn_conf"]
    assert services["worker"]["command"][4] == "worker" and services["beat"]["command"][4] == "beat"


def test_compose_sets_only_real_settings_and_its_checks_and_scrapes_match_its_binds() -> None:
    import yaml

    services = _compose()["services"]
    settings = _settings()
    for name, service in services.items():
        if "build" not in service:
            continue  # a third-party image: its variables are its own
        unknown = set(service.get("environment", {})) - settings
        assert not unknown, f"{name} sets {unknown}, which api/configs does not read"
    api_env, worker_env = services["api"]["environment"], services["worker"]["environment"]
    api_port = api_env["API_METRICS_BIND"].rpartition(":")[2]
    worker_port = worker_env["WORKER_METRICS_BIND"].rpartition(":")[2]
    assert worker_port and services["worker"]["healthcheck"]["test"][-3:-1] == ["fresh", "/app/var/worker-heartbeat"]
    assert ":5001/" in services["api"]["healthcheck"]["test"][-1] and "5001:5001" in services["api"]["ports"]
    # Beat's healthcheck watches the schedule file where the app keeps it (ext_celery: VAR_DIR/...).
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    var_dir = re.search(r"^ENV VAR_DIR=(\S+)", dockerfile, flags=re.M)
    assert var_dir is not None and services["beat"]["healthcheck"]["test"][-2] == f"{var_dir[1]}/celerybeat-schedule"
    scrape = yaml.safe_load((ROOT / "docker" / "prometheus" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]}
    assert targets == {"api": [f"api:{api_port}"], "worker": [f"worker:{worker_port}"]}
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            assert (ROOT / "docker" / volume.split(":")[0]).is_file(), volume


def test_the_healthcheck_module_tells_a_live_listener_and_a_fresh_file_from_neither(tmp_path: pathlib.Path) -> None:
    import http.server
    import threading

    from api.healthcheck import main
    from harness.processes import free_port

    class Unauthorized(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401 if self.path == "/api" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unauthorized)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert main(["http", f"http://127.0.0.1:{port}/api"]) == 0
        assert main(["http", f"http://127.0.0.1:{port}/broken"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert main(["http", f"http://127.0.0.1:{free_port()}/"]) == 1
    (tmp_path / "celerybeat-schedule.db").write_bytes(b"x")
    assert main(["fresh", str(tmp_path / "celerybeat-schedule"), "60"]) == 0
    assert main(["fresh", str(tmp_path / "other"), "60"]) == 1
    assert main(["nonsense"]) == 2


def test_the_worker_hook_freezes_the_gc_and_stops_tracking_greenlet_trees() -> None:
    # In a child: gc.freeze(), the GC's thresholds and gevent's config are process-wide.
    script = """
import gc, logging, types
import gevent
import api.gunicorn_conf as conf
assert gevent.config.track_greenlet_tree
young, middle, oldest = gc.get_threshold()
conf.post_worker_init(types.SimpleNamespace(log=logging.getLogger("worker")))
assert not gevent.config.track_greenlet_tree
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
assert gc.get_threshold() == (young, middle, conf.FULL_COLLECTION_PERIOD) and oldest < conf.FULL_COLLECTION_PERIOD
"""
    env = {key: value for key, value in os.environ.items() if key not in ("GEVENT_TRACK_GREENLET_TREE", PERIOD)}
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, env=env, timeout=60)


PERIOD = "GC_FULL_COLLECTION_PERIOD"


def test_the_full_collection_period_can_be_set_and_a_bad_one_is_refused_with_a_warning() -> None:
    script = """
import gc, logging, os, types
import api.gunicorn_conf as conf
warnings = []
log = types.SimpleNamespace(warning=lambda *args: warnings.append(args), info=lambda *args: None)
conf.post_worker_init(types.SimpleNamespace(log=log))
assert gc.get_threshold()[2] == 7 and not warnings, (gc.get_threshold(), warnings)
os.environ["GC_FULL_COLLECTION_PERIOD"] = "often"
conf.post_worker_init(types.SimpleNamespace(log=log))
assert gc.get_threshold()[2] == conf.FULL_COLLECTION_PERIOD and len(warnings) == 1, (gc.get_threshold(), warnings)
callbacks = len(gc.callbacks)
os.environ["GC_PAUSE_LOG_MS"] = "soon"
conf.post_worker_init(types.SimpleNamespace(log=log))
assert len(gc.callbacks) == callbacks and "GC_PAUSE_LOG_MS" in warnings[-1][1], warnings
os.environ["GC_PAUSE_LOG_MS"] = "20"
conf.post_worker_init(types.SimpleNamespace(log=log))
assert len(gc.callbacks) == callbacks + 1, gc.callbacks
"""
    env = {**{key: value for key, value in os.environ.items() if key != "GC_PAUSE_LOG_MS"}, PERIOD: "7"}
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, env=env, timeout=60)


def test_compose_needs_real_secrets_and_the_image_runs_as_configured() -> None:
    import yaml

    compose = yaml.safe_load((ROOT / "docker" / "docker-compose.yaml").read_text())
    env = compose["x-app-env"]
    # `${NAME:?message}`: compose refuses to start while the variable is unset or empty.
    assert env["SECRET_KEY"].startswith("${SECRET_KEY:?") and env["RESUME_TOKEN_KEYS"].startswith(
        "${RESUME_TOKEN_KEYS:?"
    )
    assert compose["services"]["api"]["healthcheck"]["test"][-1].endswith("/health/ready")
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "python:api.gunicorn_conf" in dockerfile and "/health/ready" in dockerfile
    user = re.search(r"^USER (\S+)$", dockerfile, flags=re.M)
    assert user is not None and user.group(1) not in ("root", "0")


def test_metrics_bind_without_the_gunicorn_config_refuses_to_start(tmp_path: pathlib.Path) -> None:
    from harness.processes import BIN, free_port, process_env

    bind = f"127.0.0.1:{free_port()}"
    env = process_env({"VAR_DIR": str(tmp_path), "API_METRICS_BIND": bind, "DEPLOY_ENV": "DEVELOPMENT"})
    started = subprocess.run(
        [str(BIN / "gunicorn"), "-k", "gevent", "-w", "1", "-b", f"127.0.0.1:{free_port()}", "api.app:app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode != 0
    assert "python:api.gunicorn_conf" in started.stderr and "API_METRICS_BIND" in started.stderr
    assert "Traceback" not in started.stderr


#: A version pinned to its patch release (``7.2.5``, ``v2.53.0``, ``3.12.8-slim``; PostgreSQL's are two numbers
#: since version 10, ``15.7``), not a floating tag (``redis:7``, ``postgres:15``, ``latest``).
PINNED = re.compile(r"^(postgres:\d+\.\d+|[\w./-]+:v?\d+\.\d+\.\d+)([-.][\w.]+)?$")
REQUIRED = re.compile(r"^\$\{[A-Z_]+:\?[^}]+\}$")


def test_compose_is_shipped_as_an_operator_would() -> None:
    from api.configs.service import ServiceSettings
    from api.gunicorn_conf import DEFAULT_WORKER_CONNECTIONS, FILES_RESERVED

    text = (ROOT / "docker" / "docker-compose.yaml").read_text()
    services = _compose()["services"]
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    images = [service["image"] for service in services.values() if "image" in service]
    images += re.findall(r"^FROM (\S+)", dockerfile, flags=re.M)
    assert len(images) >= 6 and all(PINNED.match(image) for image in images), images
    for name, service in services.items():
        assert service.get("restart") == "unless-stopped", f"{name} is not restarted when it dies"
        for port in service.get("ports", []):
            # Only the API is for everyone; Prometheus has no login and Grafana's is an admin's.
            assert port == "5001:5001" or port.startswith("127.0.0.1:"), (name, port)
    # Open files: a socket per event stream (two with the broadcast channel), plus what a process keeps.
    connections = int(re.search(r"WEB_WORKER_CONNECTIONS:-(\d+)", text)[1])  # type: ignore[index]
    assert connections == DEFAULT_WORKER_CONNECTIONS
    worker_needs = ServiceSettings.model_fields["REDIS_MAX_CONNECTIONS"].default + FILES_RESERVED
    for name, needed in (("api", 2 * connections + FILES_RESERVED), ("worker", worker_needs)):
        limit = services[name]["ulimits"]["nofile"]
        assert limit["soft"] == limit["hard"] >= needed, (name, limit, needed)
    # No password is written down: each is a variable compose requires, whatever uses it.
    assert REQUIRED.match(services["postgres"]["environment"]["POSTGRES_PASSWORD"])
    assert REQUIRED.match(services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"])
    assert services["grafana"]["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    redis = services["redis"]["command"]
    assert REQUIRED.match(redis[redis.index("--requirepass") + 1])
    for value in services["api"]["environment"].values():
        for secret in re.findall(r"://[^/@\s]*:([^@/\s]*)@", str(value)):
            assert REQUIRED.match(secret), f"a literal password in {value!r}"
    assert "postgres:postgres@" not in text and "PASSWORD: postgres" not in text


def test_the_image_and_make_install_use_the_lock_and_the_lock_is_current() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from tools import lock_deps

    locked = {}
    for line in lock_deps.LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            locked[name] = version
    for requirement in lock_deps.runtime_requirements():  # pyproject's ranges admit every pin
        name = canonicalize_name(requirement.name)
        assert name in locked and requirement.specifier.contains(locked[name]), (requirement, locked.get(name))
    assert lock_deps.main(["--check"]) == 0, "requirements.lock differs from this environment: `make lock`"
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --no-deps -r requirements.lock" in dockerfile
    assert "pip install --no-cache-dir --no-deps ." in dockerfile
    assert "-c requirements.lock" in (ROOT / "Makefile").read_text()
    assert all(Requirement(f"{name}=={version}") for name, version in locked.items())
