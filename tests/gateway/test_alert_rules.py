"""The alerting rules in deploy/prometheus/: valid for Prometheus, each firing on the failure it
names and quiet on a healthy gateway (promtool's own unit tests, alerts_test.yaml), and written
only on series a live gateway exports.

promtool comes from ``scripts/setup_promtool.sh`` (.cache/prometheus/promtool) or PATH; without
it the promtool tests skip, unless ``PREFIXROUTE_PROMTOOL_REQUIRED=1`` (CI), where that fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml  # PyYAML: a dependency of the kubernetes client (pyproject.toml)

from .helpers import ClusterFactory, GatewayFactory
from .test_grafana import live_series

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus"
SERIES = re.compile(r"\bprefixroute_[a-z0-9_]+")


def promtool() -> str:
    for candidate in (str(ROOT / ".cache" / "prometheus" / "promtool"), shutil.which("promtool")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    if os.environ.get("PREFIXROUTE_PROMTOOL_REQUIRED") == "1":
        pytest.fail("no promtool: run scripts/setup_promtool.sh")
    pytest.skip("no promtool (scripts/setup_promtool.sh installs it)")


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((RULES / "alerts.yaml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(RULES / "alerts.yaml")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_each_alert_fires_on_its_failure_and_not_on_a_healthy_gateway() -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yaml"],
        capture_output=True, text=True, timeout=60, cwd=RULES,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    tested = yaml.safe_load((RULES / "alerts_test.yaml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tested
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == {str(rule["alert"]) for rule in rules()}, "an alert no test sees firing"


def test_every_alert_has_a_severity_and_says_what_to_do() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule


async def test_every_series_the_rules_read_exists_in_a_live_metrics_page(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    sampled, _ = await live_series(make_cluster, make_gateway, session)
    wanted = {name for rule in rules() for name in SERIES.findall(str(rule["expr"]))}
    assert len(wanted) >= 7
    assert not sorted(wanted - sampled), f"read but not in a live /metrics: {wanted - sampled}"
