"""What ``bench`` measures and what it cannot: the gateway's predicted cached tokens come from
its ``x-prefixroute-predicted-cached-tokens`` header; what is not seen from outside (decision
time, busy time, evictions, the router's index and learned speeds) is null, never 0."""

from __future__ import annotations

import asyncio
import io
import json
import re
from typing import Any

import aiohttp
import pytest

from prefixroute.bench import ReplayConfig, ReplayResult, replay
from prefixroute.cli import main
from prefixroute.commands.bench import _metrics, _print
from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.gateway import PREDICTED_HEADER as GATEWAY_HEADER
from prefixroute.gateway import Gateway, GatewayConfig
from prefixroute.sim import oracle_floor, write_json
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload

SCALE = 0.05  # wall seconds per workload second
UNSEEN = ("per_replica_busy", "evictions", "decision_us", "per_replica_speed")


def _emulator() -> EmulatorConfig:
    return EmulatorConfig(ReplicaConfig(block_size=1), time_scale=SCALE)


def _metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples over every replica whose labels include ``labels``."""
    total = 0.0
    for match in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M):
        if all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


async def _through_gateway() -> tuple[ReplayResult, str]:
    """seed-conversation through a gateway (the default policy) over 2 emulated replicas;
    the replay and the gateway's /metrics after it."""
    w = make_workload("seed-conversation")
    cluster = await start_replicas(2, _emulator())
    try:
        cfg = GatewayConfig(port=0, replicas=tuple(cluster.urls), policy=DEFAULT_POLICY)
        async with Gateway(cfg) as gw:
            result = await replay(w, ReplayConfig(gw.url, time_scale=SCALE), "gw")
            async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as resp:
                text = await resp.text()
    finally:
        await cluster.stop()
    return result, text


async def test_predicted_cached_tokens_are_what_the_gateway_said() -> None:
    """The JSON's predicted cached tokens are the sum of the gateway's headers, which its
    /metrics counted too, and the stale rate is its over / all (they were 0 and 0.0)."""
    from prefixroute.bench._client import PREDICTED_HEADER  # (not there before the fix)

    assert PREDICTED_HEADER == GATEWAY_HEADER
    result, text = await _through_gateway()
    assert result.errors == []
    recs = result.run.records
    assert all(r.predicted_cached_tokens is not None for r in recs)
    m = _metrics(result, oracle_floor(make_workload("seed-conversation"), 1), 1.0)
    predicted = _metric_sum(text, "prefixroute_predicted_cached_tokens_total")
    assert m.predicted_cached_tokens == predicted > 0
    over = _metric_sum(text, "prefixroute_cache_predictions_total", outcome="over")
    judged = _metric_sum(text, "prefixroute_cache_predictions_total")
    assert judged == len(recs)
    assert m.stale_rate == pytest.approx(over / judged)
    doc = m.to_json()
    assert [t["predicted_cached_tokens"] for t in doc["turns"]] == [
        r.predicted_cached_tokens for r in recs
    ]
    assert all(doc[k] is None for k in UNSEEN)
    assert result.run.index_blocks is None and result.run.index_evictions is None


async def test_a_server_without_the_header_leaves_predictions_null(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A replica asked directly (as a plain vLLM) sends no prediction: null in the JSON, not
    0, and no stale rate made of nothing; the table says nothing of them."""
    w = make_workload("seed-conversation")
    cluster = await start_replicas(1, _emulator())
    try:
        result = await replay(w, ReplayConfig(cluster.urls[0], time_scale=SCALE), "direct")
    finally:
        await cluster.stop()
    assert result.errors == [] and result.cached_reported == len(result.run.records)
    m = _metrics(result, oracle_floor(w, 1), 1.0)
    out = io.StringIO()
    write_json([m], out, {})
    row = json.loads(out.getvalue())["policies"][0]
    assert row["cached_tokens"] == 400 + 700 + 1000 + 1400  # measured: a number
    assert row["predicted_cached_tokens"] is None and row["stale_rate"] is None
    assert all(t["predicted_cached_tokens"] is None for t in row["turns"])
    assert all(row[k] is None for k in UNSEEN)
    _print([m], [result], "t")
    assert "predicted" not in capsys.readouterr().out


def _cli(url: str) -> int:
    return main(["bench", "--url", url, "-w", "seed-conversation", "--time-scale", str(SCALE),
                 "--json"])  # fmt: skip


async def test_bench_url_json_is_null_where_nothing_was_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``bench --url`` at a server that sends no prediction, end to end through --json."""
    cluster = await start_replicas(1, _emulator())
    try:
        code = await asyncio.to_thread(_cli, cluster.urls[0])
    finally:
        await cluster.stop()
    assert code == 0
    row: dict[str, Any] = json.loads(capsys.readouterr().out)["policies"][0]
    for key in ("predicted_cached_tokens", "stale_rate", *UNSEEN):
        assert key in row and row[key] is None, key  # the same keys, null
    assert row["cached_tokens"] == 3_500


def test_emulated_bench_reports_the_gateway_s_predictions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No --url: the in-process gateways' headers give each policy its predictions; the
    replicas' busy time, evictions and the router's decision time stay null."""
    policies = f"round_robin,{DEFAULT_POLICY}"
    code = main(["bench", "-w", "seed-conversation", "-n", "2", "--block-size", "1",
                 "--time-scale", str(SCALE), "-p", policies, "--json"])  # fmt: skip
    assert code == 0
    by = {p["policy"]: p for p in json.loads(capsys.readouterr().out)["policies"]}
    assert by[DEFAULT_POLICY]["predicted_cached_tokens"] > 0
    assert isinstance(by[DEFAULT_POLICY]["stale_rate"], float)
    assert by["round_robin"]["predicted_cached_tokens"] is not None
    for row in by.values():
        assert all(row[k] is None for k in UNSEEN)


def test_simulate_still_reports_what_it_sees(capsys: pytest.CaptureFixture[str]) -> None:
    """The simulator sees everything: its JSON keeps numbers where bench has null."""
    assert main(["simulate", "-w", "seed-conversation", "--replicas", "2", "-p",
                 DEFAULT_POLICY, "--json"]) == 0  # fmt: skip
    row = json.loads(capsys.readouterr().out)["policies"][0]
    assert row["predicted_cached_tokens"] == 3_500 and row["stale_rate"] == 0.0
    assert row["evictions"] == 0 and isinstance(row["per_replica_busy"]["r0"], float)
    assert row["decision_us"]["p99"] > 0 and isinstance(row["per_replica_speed"], dict)
