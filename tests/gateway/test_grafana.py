"""The Grafana dashboard in deploy/grafana/ queries only series a live gateway exports.

Issue 14: "A Grafana dashboard JSON in deploy/, built on the /metrics names. A test checks that
every series it queries exists in a live /metrics." A renamed metric, or a panel that queries a
name the gateway never exported, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .helpers import STEADY, ClusterFactory, GatewayFactory, send, words

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
SERIES = re.compile(r"\bprefixroute_[a-z0-9_]+")
# Series that exist only once their event happened (a request judged at fault, a stream cut by
# the gateway): for these the family must be declared (# HELP / # TYPE), not yet sampled.
EVENT_ONLY = {"prefixroute_request_faults_total", "prefixroute_cut_streams_total"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GRAFANA / "prefixroute.json").read_text())
    return loaded


def queried_series(board: dict[str, Any]) -> set[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return {name for e in exprs for name in SERIES.findall(e)}


def test_the_committed_json_is_what_the_builder_writes() -> None:
    spec = importlib.util.spec_from_file_location("build_dashboard", GRAFANA / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dashboard() == dashboard(), "run deploy/grafana/build_dashboard.py"


def test_every_panel_has_a_query_and_a_unique_id() -> None:
    board = dashboard()
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 12
    for p in graphs:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            e = t["expr"]
            assert e.count("(") == e.count(")") and e.count("{") == e.count("}"), e


async def live_series(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> tuple[set[str], set[str]]:
    """The series a live gateway's /metrics samples, and the families it declares, after
    traffic that took every path the dashboard and the alert rules chart: streamed and plain
    answers, a replica that stopped (refusals, retries, an ejection)."""
    cluster = await make_cluster(3)
    gw = await make_gateway(cluster.urls, **STEADY)
    await cluster.replicas[2].stop()  # registered and healthy, then gone: refusals and retries
    for i in range(12):  # distinct prompts: some go to the stopped replica
        body = {"model": "emulated", "prompt": f"user {i}: " + words(200), "max_tokens": 4,
                "stream": i % 2 == 0}
        reply = await send(session, gw.url, "/v1/completions", body)
        assert reply.status == 200, reply
    async with session.get(gw.url + "/metrics") as resp:
        assert resp.status == 200
        page = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(page)}
    sampled = {s.name for f in families.values() for s in f.samples}
    declared = set(families) | {f"{n}_total" for n, f in families.items() if f.type == "counter"}
    return sampled, declared


async def test_every_queried_series_exists_in_a_live_metrics_page(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    sampled, declared = await live_series(make_cluster, make_gateway, session)
    wanted = queried_series(dashboard())
    assert len(wanted) >= 15
    missing = sorted(n for n in wanted - EVENT_ONLY if n not in sampled)
    assert not missing, f"queried but not in a live /metrics: {missing}"
    assert declared >= EVENT_ONLY, sorted(EVENT_ONLY - declared)
