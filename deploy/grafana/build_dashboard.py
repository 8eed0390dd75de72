"""Writes ``prefixroute.json``, the Grafana dashboard for the gateway's /metrics.

Run ``python deploy/grafana/build_dashboard.py`` after changing a panel; the JSON is committed so
that an operator imports it without running anything. ``tests/gateway/test_grafana.py`` checks
that every series the dashboard queries exists in a live gateway's /metrics.

Panels are declared as rows of (title, unit, [(PromQL, legend)]); layout is computed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'replica=~"$replica"'  # every per-replica query honours the replica picker

# (row title, [(panel title, unit, [(expr, legend)])])
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]]]]]] = [
    ("Traffic", [
        ("Requests by replica", "reqps", [
            (f"sum by (replica) (rate(prefixroute_requests_total{{{R}}}[$__rate_interval]))",
             "{{replica}}"),
        ]),
        ("Requests by routing reason", "reqps", [
            ("sum by (reason) (rate(prefixroute_requests_total[$__rate_interval]))",
             "{{reason}}"),
        ]),
        ("Answers by status", "reqps", [
            ("sum by (status) (rate(prefixroute_requests_total[$__rate_interval]))",
             "{{status}}"),
        ]),
        ("In flight", "short", [
            (f"prefixroute_in_flight{{{R}}}", "{{replica}}"),
        ]),
    ]),
    ("Prefix cache", [
        ("Prompt tokens served from cache (replica-reported)", "percentunit", [
            (f"sum by (replica) (rate(prefixroute_actual_cached_tokens_total{{{R}}}"
             f"[$__rate_interval])) / sum by (replica) (rate(prefixroute_prompt_tokens_total"
             f"{{{R}}}[$__rate_interval]))", "{{replica}}"),
        ]),
        ("Predicted vs actual cached tokens", "short", [
            (f"sum(rate(prefixroute_predicted_cached_tokens_total{{{R}}}[$__rate_interval]))",
             "predicted"),
            (f"sum(rate(prefixroute_actual_cached_tokens_total{{{R}}}[$__rate_interval]))",
             "actual (replica usage)"),
        ]),
        ("Cache predictions by outcome", "short", [
            ("sum by (outcome) (rate(prefixroute_cache_predictions_total[$__rate_interval]))",
             "{{outcome}}"),
        ]),
        ("Prefix index", "short", [
            ("prefixroute_prefix_index_blocks", "blocks"),
            ("prefixroute_prefix_index_entries", "entries (block x replica)"),
            ("rate(prefixroute_prefix_index_evictions_total[$__rate_interval])",
             "evictions/s"),
        ]),
    ]),
    ("Calibration", [
        ("Learned prefill rate", "short", [
            (f"prefixroute_replica_prefill_tokens_per_second{{{R}}}", "{{replica}} tokens/s"),
        ]),
        ("Learned decode step", "s", [
            (f"prefixroute_replica_decode_step_seconds{{{R}}}", "{{replica}}"),
        ]),
        ("Speed observations", "short", [
            (f"prefixroute_replica_speed_observations{{{R}}}", "{{replica}} {{phase}}"),
        ]),
        ("Characters per token", "short", [
            ("prefixroute_chars_per_token", "{{model}}"),
        ]),
    ]),
    ("Router cost and health", [
        ("Decision time p50 / p99", "s", [
            ("histogram_quantile(0.5, sum by (le) "
             "(rate(prefixroute_decision_seconds_bucket[$__rate_interval])))", "p50"),
            ("histogram_quantile(0.99, sum by (le) "
             "(rate(prefixroute_decision_seconds_bucket[$__rate_interval])))", "p99"),
        ]),
        ("Replicas healthy", "short", [
            (f"prefixroute_replica_healthy{{{R}}}", "{{replica}}"),
        ]),
        ("Upstream failures and retries", "short", [
            (f"sum by (replica, kind) (rate(prefixroute_upstream_failures_total{{{R}}}"
             f"[$__rate_interval]))", "{{replica}} {{kind}}"),
            ("sum by (reason) (rate(prefixroute_retries_total[$__rate_interval]))",
             "retry: {{reason}}"),
            ("sum by (kind) (rate(prefixroute_request_faults_total[$__rate_interval]))",
             "request fault: {{kind}}"),
        ]),
        ("Streams cut by the gateway", "short", [
            ("sum by (reason) (rate(prefixroute_cut_streams_total[$__rate_interval]))",
             "{{reason}}"),
        ]),
    ]),
]


def panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int
          ) -> dict[str, Any]:
    return {
        "id": pid, "type": "timeseries", "title": title, "datasource": DS,
        "gridPos": {"h": 8, "w": 6, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for row_title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, (title, unit, targets) in enumerate(row):
            panels.append(panel(pid, title, unit, targets, 6 * (i % 4), y + 8 * (i // 4)))
            pid += 1
        y += 8 * (-(-len(row) // 4))
    return {
        "uid": "prefixroute-gateway",
        "title": "prefixroute gateway",
        "description": "Prefix-aware routing: traffic, cache savings, learned replica speeds.",
        "tags": ["prefixroute", "llm", "inference"],
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-30m", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus",
             "label": "Data source"},
            {"name": "replica", "type": "query", "datasource": DS, "label": "Replica",
             "query": {"query": "label_values(prefixroute_in_flight, replica)",
                       "refId": "replicas"},
             "definition": "label_values(prefixroute_in_flight, replica)",
             "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2,
             "current": {"text": "All", "value": "$__all"}},
        ]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("prefixroute.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
