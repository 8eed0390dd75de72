"""Tests for prefixroute.gateway._metrics: the families its docstring lists, with the numbers
read from the router (through its methods) and the registry at scrape time. No network: the
collectors are read from the metrics' own registry."""

from __future__ import annotations

import pytest

from prefixroute.core import BlockHash, BlockHasher, ReplicaId, Router, make_policy
from prefixroute.gateway import GatewayConfig, ReplicaRegistry
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._precise import PreciseMode

A, B = ReplicaId("http://a:1"), ReplicaId("http://b:2")
CHAIN = [BlockHash(h) for h in (1, 2, 3, 4)]


def gateway_metrics(**router: object) -> tuple[GatewayMetrics, Router, ReplicaRegistry]:
    r = Router(make_policy("round_robin"), BlockHasher(block_size=1), **router)  # type: ignore[arg-type]
    registry = ReplicaRegistry(r, GatewayConfig())
    registry.add(A)
    registry.add(B)
    return GatewayMetrics(r, registry), r, registry


def value(m: GatewayMetrics, name: str, **labels: str) -> float:
    found = m.registry.get_sample_value(name, labels)
    assert found is not None, f"no sample {name}{labels}"
    return found


USAGE_SERIES = (
    ("prefixroute_predicted_cached_tokens_total", {}),
    ("prefixroute_actual_cached_tokens_total", {}),
    ("prefixroute_prompt_tokens_total", {}),
    ("prefixroute_usage_missing_total", {}),
    *(("prefixroute_cache_predictions_total", {"outcome": o}) for o in ("exact", "over", "under")),
)


def test_each_replicas_usage_series_exist_at_zero_from_its_registration() -> None:
    """Prometheus' advice: a series that appears only at its first count leaves rate() and
    alerts on it without data until then. Replicas known at the start and added later alike."""
    m, _, registry = gateway_metrics()
    c = ReplicaId("http://c:3")
    registry.add(c)  # as the admin API and discovery add one
    for replica in (A, B, c):
        for name, labels in USAGE_SERIES:
            assert value(m, name, replica=replica, **labels) == 0
    m.observe_usage(c, predicted=64, actual=0, prompt=100)  # counting still counts
    assert value(m, "prefixroute_cache_predictions_total", replica=c, outcome="over") == 1
    assert value(m, "prefixroute_cache_predictions_total", replica=c, outcome="exact") == 0


def test_the_live_numbers_are_the_routers_and_the_registrys() -> None:
    m, router, registry = gateway_metrics(index_capacity_blocks=3)
    view = router.view("q1", tokens=list(range(200)), output_tokens=5)
    router.route(view, 0.0, [A])
    router.first_token("q1", 0.5)
    router.complete("q1", 1.0, output_tokens=5)  # A learns its speed from this one
    router.route(router.view("q0", tokens=list(range(300, 400))), 1.0, [A])
    router.first_token("q0", 1.2)
    router.complete("q0", 1.5)  # no output tokens: its prefill only
    router.route(router.view("q2", tokens=[7, 8]), 2.0, [A])  # in flight
    registry.drain(B)
    in_flight = "prefixroute_in_flight"
    assert (value(m, in_flight, replica=A), value(m, in_flight, replica=B)) == (1, 0)
    assert value(m, "prefixroute_replica_healthy", replica=A) == 1.0
    assert value(m, "prefixroute_replica_healthy", replica=B) == 0.0  # draining
    speed = router.replica_load(A).speed
    assert (speed.prefill_observations, speed.decode_observations) == (2, 1)
    speed.prefill_tokens_per_s, speed.decode_step_s = 1234.0, 0.025  # as if learned so
    assert value(m, "prefixroute_replica_prefill_tokens_per_second", replica=A) == 1234.0
    assert value(m, "prefixroute_replica_decode_step_seconds", replica=A) == 0.025
    speed.attention_s = 0.0
    assert value(m, "prefixroute_replica_effective_prefill_tokens_per_second", replica=A) == 1234.0
    # With attention (s per token per 1k tokens of context): A's first tokens computed 200 and
    # 100 tokens with nothing before them, 200 x 100 / 1000 + 100 x 50 / 1000 = 25
    # token-kilotokens of context work over 300 tokens.
    speed.attention_s = 1e-4
    effective = value(m, "prefixroute_replica_effective_prefill_tokens_per_second", replica=A)
    assert effective == pytest.approx(1 / (1 / 1234.0 + 1e-4 * 25 / 300))
    prior = router.replica_load(B).speed
    assert value(m, "prefixroute_replica_decode_step_seconds", replica=B) == prior.decode_step_s
    # The kind of its prefill steps (core/batch_mixing.py): vLLM's until learned otherwise.
    assert value(m, "prefixroute_replica_prefill_alone", replica=A) == 0.0
    speed.carries_decodes = False
    assert value(m, "prefixroute_replica_prefill_alone", replica=A) == 1.0
    assert speed.snapshot()["prefill_steps"] == "alone"
    seen = "prefixroute_replica_speed_observations"
    assert value(m, seen, replica=A, phase="prefill") == 2
    assert value(m, seen, replica=A, phase="decode") == 1
    assert value(m, seen, replica=B, phase="decode") == 0


def test_a_replica_s_batch_size_is_exported_once_known() -> None:
    from prefixroute.core import SpeedPrior
    from prefixroute.core.batch_slots import FULL_REPORTS

    m, router, _ = gateway_metrics()
    slots = "prefixroute_replica_batch_slots"
    assert m.registry.get_sample_value(slots, {"replica": A}) is None  # not known yet
    router.loads.tell(A, SpeedPrior(max_running=48))
    for _ in range(FULL_REPORTS):
        router.observe_replica(B, num_running=12, num_waiting=3)
    assert (value(m, slots, replica=A), value(m, slots, replica=B)) == (48, 12)
    assert router.replica_load(A).speed_report()["batch_slots"] == 48


def test_each_ejection_is_counted_and_a_drain_is_not() -> None:
    """``prefixroute_replica_healthy`` is 0 while a replica is out *or draining*, and an
    ejection lasts only eject_s: a scrape can miss it. The counter keeps every one."""
    m, _, registry = gateway_metrics()
    ejections = "prefixroute_replica_ejections_total"
    assert value(m, ejections, replica=A) == value(m, ejections, replica=B) == 0
    registry.record_probe(A, ok=False, now=0.0, first=True)  # starts out: one ejection
    registry.record_probe(A, ok=True, now=1.0)  # in with its first good probe
    for t in (2.0, 3.0, 4.0):  # three consecutive failures: out again
        registry.record_failure(A, now=t, why="test")
    registry.drain(B)
    assert value(m, ejections, replica=A) == 2
    assert value(m, ejections, replica=B) == 0  # draining takes it out of rotation, no ejection
    assert registry.describe(registry.get(A))["ejections"] == 2


def test_chars_per_token_are_labelled_by_model_or_none() -> None:
    m, router, _ = gateway_metrics()
    for rid, model in (("q1", "m"), ("q2", None)):
        router.route(router.view(rid, text="x" * 600, model=model), 0.0)
        router.observe_usage(rid, prompt_tokens=100 if model else 200, cached_tokens=None)
    learned = router.chars_per_token()
    assert value(m, "prefixroute_chars_per_token", model="m") == learned["m"].value
    assert value(m, "prefixroute_chars_per_token", model="none") == learned[None].value
    assert learned["m"].value != learned[None].value


def test_the_prefix_index_families_count_blocks_entries_and_evictions() -> None:
    m, router, _ = gateway_metrics(index_capacity_blocks=3)
    router.remote_routed(A, CHAIN[:2], 0.0)
    router.remote_routed(B, CHAIN[:3], 0.0)
    router.remote_routed(A, CHAIN, 0.0)  # 4 blocks, room for 3: one evicted
    assert value(m, "prefixroute_prefix_index_blocks") == router.index_blocks() == 3
    assert value(m, "prefixroute_prefix_index_entries") == router.index_entries() == 6
    assert value(m, "prefixroute_prefix_index_evictions_total") == 1


@pytest.mark.parametrize("ttl_s", [1.0, None])
def test_precise_mode_reports_its_speculative_entries_when_it_keeps_them(
    ttl_s: float | None,
) -> None:
    m, router, _ = gateway_metrics(insert_on_route=False, speculative_ttl_s=ttl_s)
    m.watch_precise(PreciseMode(router, {}))
    router.route(router.view("q", tokens=[1, 2, 3]), 0.0)
    found = m.registry.get_sample_value("prefixroute_speculative_entries")
    assert found == (3 if ttl_s is not None else None)


def test_usage_is_judged_exact_over_or_under() -> None:
    """Exact: less than one KV block (16 tokens here) apart; over or under: a block or more."""
    m, router, _ = gateway_metrics()
    assert router.kv_block_size() == 16
    m.observe_usage(A, predicted=10, actual=10, prompt=50)
    m.observe_usage(A, predicted=36, actual=20)  # a block over: a stale decision
    m.observe_usage(A, predicted=0, actual=16, prompt=40)
    m.observe_usage(A, predicted=7, actual=None)
    m.observe_usage(A, predicted=35, actual=20)  # 15 tokens over: the unit, not staleness
    m.observe_usage(A, predicted=5, actual=20)
    outcomes = {
        o: value(m, "prefixroute_cache_predictions_total", replica=A, outcome=o)
        for o in ("exact", "over", "under")
    }
    assert outcomes == {"exact": 3, "over": 1, "under": 1}
    assert value(m, "prefixroute_predicted_cached_tokens_total", replica=A) == 86
    assert value(m, "prefixroute_actual_cached_tokens_total", replica=A) == 86
    assert value(m, "prefixroute_prompt_tokens_total", replica=A) == 90
    assert value(m, "prefixroute_usage_missing_total", replica=A) == 1
    m.count_request(A, 200, "prefix_match")
    requests = "prefixroute_requests_total"
    assert value(m, requests, replica=A, status="200", reason="prefix_match") == 1


def test_every_per_request_family_is_declared() -> None:
    m, _, _ = gateway_metrics()
    names = {metric.name for metric in m.registry.collect()}
    declared = {
        "prefixroute_requests", "prefixroute_predicted_cached_tokens",
        "prefixroute_actual_cached_tokens", "prefixroute_prompt_tokens",
        "prefixroute_usage_missing", "prefixroute_cache_predictions",
        "prefixroute_tokenize_seconds", "prefixroute_tokenize_failures",
        "prefixroute_decision_seconds", "prefixroute_retries", "prefixroute_upstream_failures",
        "prefixroute_request_faults", "prefixroute_cut_streams",
    }  # fmt: skip
    assert declared <= names
    assert m.upstream_failures._labelnames == ("replica", "kind")
    assert m.requests._labelnames == ("replica", "status", "reason")
