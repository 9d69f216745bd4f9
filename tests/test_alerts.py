"""The alerting rules (docker/prometheus/alerts.yml): valid, about metrics the app exports, and each one
firing on the failure it is for and quiet on a healthy system (promtool's rule unit tests)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import yaml

from api.libs.metrics import METRICS, exported_names
from harness.processes import ROOT
from tests.test_deploy_files import PROMQL_WORDS

RULES = ROOT / "docker" / "prometheus"
#: Prometheus's own: whether a target answered its scrape, and the labels every target's series get.
PROMETHEUS_OWN = {"up", "job", "instance"}


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: `make promtool` installs Debian's prometheus package"
    return found


def test_the_rules_pass_promtool_and_their_unit_tests() -> None:
    for command in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run([_promtool(), *command], cwd=RULES, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_rule_names_metrics_the_app_exports() -> None:
    rules = [rule for group in yaml.safe_load((RULES / "alerts.yml").read_text())["groups"] for rule in group["rules"]]
    labels = {label for metric in METRICS for label in metric.labels}
    for rule in rules:
        bare = re.sub(r'"[^"]*"|\[[^]]*\]|\b\d[\d.]*(?:e[-+]?\d+)?\b', "", rule["expr"])
        words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare))
        named = {word for word in words if word not in PROMQL_WORDS and word not in labels | PROMETHEUS_OWN}
        assert (named or "up" in words) and named <= exported_names(), (rule["alert"], named - exported_names())
    assert {rule["alert"] for rule in rules} >= {
        "StreamStoreUnavailable",
        "RunsEndedByTheReaper",
        "LiveDeliveryLagHigh",
        "ResumeRefusalsHigh",
        "LimitRefusalsHigh",
        "TargetDown",
        "ApiErrorRatioHigh",
        "WorkerNotConsuming",
    }
    assert "alerts.yml" in (RULES / "prometheus.yml").read_text()


def test_the_compose_prometheus_loads_the_rules() -> None:
    compose = yaml.safe_load((ROOT / "docker" / "docker-compose.yaml").read_text())
    mounted = [
        pathlib.PurePosixPath(volume.split(":")[1]).name for volume in compose["services"]["prometheus"]["volumes"]
    ]
    assert "alerts.yml" in mounted
