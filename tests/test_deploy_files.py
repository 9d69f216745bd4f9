"""docker-compose.yaml cannot run here (no Docker engine); keep it consistent with the settings."""

from __future__ import annotations

import pathlib
import re

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
    }
    assert wanted <= used, wanted - used
    prometheus = (ROOT / "docker" / "prometheus" / "prometheus.yml").read_text()
    assert "api:9101" in prometheus and "worker:9102" in prometheus
