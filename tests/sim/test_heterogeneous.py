"""Heterogeneous fleets in the simulator: the router learns each replica's speed from the same
calls the gateway makes, and the default policy routes by it.

Every run is small (seconds of wall time); the benchmark (``benchmarks/heterogeneous.py``)
measures the same things at full size and over seeds.
"""

from __future__ import annotations

import hashlib
import io

import pytest
from rich.console import Console

from prefixroute.core import DEFAULT_POLICY, make_policy
from prefixroute.sim.cluster import ClusterSim, RunResult, SpeedSample
from prefixroute.sim.fleet import Fleet, SpeedChange, parse_fleet
from prefixroute.sim.metrics import oracle_floor, summarize
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.report import speed_table
from prefixroute.sim.workloads import make_workload

CFG = ReplicaConfig()
HALF_SLOW = "2:prefill=20000+2:prefill=5000"  # half the replicas prefill 4x slower
TOLERANCE = 0.15


def run(
    workload: str,
    overrides: dict[str, str],
    policy: str,
    fleet: Fleet | None = None,
    trace: bool = False,
    config: ReplicaConfig = CFG,
    **params: object,
) -> RunResult:
    w = make_workload(workload, 0, overrides)
    policy_ = make_policy(policy, **params)
    return ClusterSim(w, policy_, 4, config, 0, fleet=fleet, trace_speeds=trace).run()


def digest(result: RunResult) -> str:
    rows = [
        (r.request_id, r.replica, r.cached_tokens, r.first_token_s, r.finish_s)
        for r in result.records
    ]
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


# Measured on the tree before per-replica speeds existed (commit c826a36): the policies that use
# no speed, and the default policy with its fixed constants, must still run exactly so.
BEFORE = {
    ("round_robin", False): "f3ad42ffda2639a9",
    ("cache_aware", False): "0e7a7623d55089d4",
    (DEFAULT_POLICY, False): "c633c0fdf18121ae",
}


@pytest.mark.parametrize(("policy", "learned"), list(BEFORE))
def test_an_equal_fleet_runs_exactly_as_before(policy: str, learned: bool) -> None:
    small = {"sessions": "80", "rate": "4"}
    tight = ReplicaConfig(kv_capacity_blocks=1024)  # small caches: evictions count too
    params = {} if policy != DEFAULT_POLICY else {"learned_speeds": learned}
    plain = run("multi-turn", small, policy, config=tight, **params)
    assert sum(r.evictions for r in plain.replicas) > 0
    assert digest(plain) == BEFORE[(policy, learned)]
    for spec in ("4", "2+2", "1+3:prefill=10000"):
        fleet = parse_fleet(spec, tight)
        assert digest(run("multi-turn", small, policy, fleet, config=tight, **params)) == (
            BEFORE[(policy, learned)]
        )


def at_request(samples: list[SpeedSample], replica: str, n: int) -> SpeedSample:
    mine = [s for s in samples if s.replica == replica]
    assert len(mine) >= n, f"{replica} completed {len(mine)} requests, fewer than {n}"
    return mine[n - 1]


def error(s: SpeedSample) -> float:
    return abs(s.learned_prefill_tokens_per_s / s.prefill_tokens_per_s - 1.0)


def test_learned_rates_within_15_percent_after_200_requests() -> None:
    # Round robin gives every replica the same share; the load leaves the slow ones room.
    res = run("no-sharing", {"requests": "900", "rate": "10"}, "round_robin",
              parse_fleet(HALF_SLOW, CFG), trace=True)  # fmt: skip
    for replica in ("r0", "r1", "r2", "r3"):
        s = at_request(res.speed_trace, replica, 200)
        assert error(s) <= TOLERANCE, (replica, s)
        assert s.learned_decode_step_s == pytest.approx(s.decode_step_s, rel=TOLERANCE)


def test_a_replica_that_slows_down_is_followed_within_200_requests() -> None:
    fleet = Fleet.uniform(4, CFG).with_changes([SpeedChange(55.0, "r1", 4_000.0)])
    res = run("no-sharing", {"requests": "1500", "rate": "12"}, "round_robin", fleet, trace=True)
    r1 = [s for s in res.speed_trace if s.replica == "r1"]
    before = [s for s in r1 if s.prefill_tokens_per_s == 10_000.0]
    after = [s for s in r1 if s.prefill_tokens_per_s == 4_000.0]
    assert error(before[-1]) <= TOLERANCE  # it had learned the old speed
    assert len(after) >= 200
    assert error(after[199]) <= TOLERANCE, after[199]
    assert error(after[0]) > 1.0  # and it did not know the new one at once


def slow_share(res: RunResult) -> float:
    per = {r.replica: r.requests for r in res.replicas}
    return (per["r2"] + per["r3"]) / sum(per.values())


def test_default_policy_sends_slow_replicas_less_before_their_queues_build() -> None:
    # 10% of the fleet's prefill capacity: queues seldom form, so only speed can tell replicas
    # apart. With fixed constants, idle replicas look alike and the slow half gets its share.
    light = {"requests": "600", "rate": "5"}
    fleet = parse_fleet(HALF_SLOW, CFG)
    learned = run("no-sharing", light, DEFAULT_POLICY, fleet)
    fixed = run("no-sharing", light, DEFAULT_POLICY, fleet, learned_speeds=False)
    assert slow_share(fixed) > 0.35
    assert slow_share(learned) < 0.15
    p99 = {
        name: summarize(r, None).ttft_ms["p99"] for name, r in (("l", learned), ("f", fixed))
    }
    assert p99["l"] < p99["f"]


def test_the_report_shows_learned_against_true_speed() -> None:
    w = make_workload("no-sharing", 0, {"requests": "200", "rate": "5"})
    res = ClusterSim(w, make_policy("round_robin"), fleet=parse_fleet(HALF_SLOW, CFG)).run()
    m = summarize(res, oracle_floor(w, 16))
    speeds = m.per_replica_speed
    assert set(speeds) == {"r0", "r1", "r2", "r3"}
    assert speeds["r2"]["prefill_tokens_per_s"] == 5_000.0
    assert speeds["r2"]["learned_prefill_tokens_per_s"] == pytest.approx(5_000.0, rel=TOLERANCE)
    assert speed_table([m]) is not None
    assert speeds["r2"]["attention_tokens"] == 0.0  # none set: no attention column
    assert "attention" not in _text(speed_table([m]))


def test_the_report_shows_learned_against_true_attention() -> None:
    w = make_workload("multi-turn", 0, {"sessions": "150", "rate": "2"})
    fleet = parse_fleet("2:attention=4000+2", CFG)
    m = summarize(ClusterSim(w, make_policy("round_robin"), fleet=fleet).run(), oracle_floor(w, 16))
    speeds = m.per_replica_speed
    assert speeds["r0"]["attention_tokens"] == 4_000.0
    assert speeds["r0"]["learned_attention_tokens"] == pytest.approx(4_000.0, rel=0.25)
    assert speeds["r3"]["attention_tokens"] == 0.0
    text = _text(speed_table([m]))
    assert "attention" in text
    r0 = next(line for line in text.splitlines() if "r0" in line)
    assert "4,000" in r0  # the true setting, beside the learned one


def _text(table: object) -> str:
    console = Console(width=250, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("seed", range(3))
def test_a_fleet_faster_than_the_constants_uses_every_replica(seed: int) -> None:
    """Every replica 3x faster than the configured 10,000 tokens/s, and a fifth joining at 8 s:
    each serves at least a twentieth of the requests (core/load.py: a cold replica starts from
    the fleet's learned speed). Started from the constants, the replicas that warmed up first
    looked 3x faster than the rest, and two or three of the five were sent nothing."""
    overrides = {"sessions": "100", "rate": "8.6", "add_replica_at_s": "8"}
    w = make_workload("multi-turn", seed, overrides)
    fast = ReplicaConfig(prefill_tokens_per_s=30_000.0)
    result = ClusterSim(w, make_policy(DEFAULT_POLICY), 4, fast, seed).run()
    served = summarize(result, None).per_replica_requests
    assert len(served) == 5
    assert min(served.values()) >= len(result.records) / 20, served


def test_told_speeds_are_each_replica_s_priors_and_pay_where_no_first_token_is_seen() -> None:
    """``tell_speeds``: the router starts from each replica's true speed (as a gateway given
    --replica-speed), so with every answer plain, where nothing else teaches it early, the
    slow half is not sent what the fast half can do: the p99 TTFT is lower than untold."""
    from prefixroute.core import SpeedConfig

    fleet = parse_fleet(HALF_SLOW, CFG)
    w = make_workload("hot-prefix", 0, {"requests": "400"})
    fixed = SpeedConfig(learn=False)  # the priors stay: they are what was told
    told = ClusterSim(w, make_policy(DEFAULT_POLICY), fleet=fleet, speed=fixed,
                      tell_speeds=True).run()  # fmt: skip
    rates = sorted(r.learned_prefill_tokens_per_s or 0.0 for r in told.replicas)
    assert rates == [5_000.0, 5_000.0, 20_000.0, 20_000.0]

    def p99(told: bool) -> float:
        sim = ClusterSim(w, make_policy(DEFAULT_POLICY), fleet=fleet, plain=1.0,
                         tell_speeds=told)  # fmt: skip
        ttfts = sorted(r.ttft_s for r in sim.run().records if r.ttft_s is not None)
        return ttfts[int(0.99 * (len(ttfts) - 1))]

    assert p99(True) < 0.5 * p99(False)


@pytest.mark.parametrize("workload", ["multi-turn", "no-sharing"])
def test_learned_rates_are_the_linear_part_where_attention_costs(workload: str) -> None:
    """Replicas whose prompt tokens cost more the longer the context before them (attention,
    core/context_cost.py): the rate learned is each replica's linear rate, within 15% after 200
    requests, not an average over the contexts it saw."""
    fleet = parse_fleet("2:prefill=20000,attention=4000+2:prefill=5000,attention=4000", CFG)
    overrides = {
        "multi-turn": {"sessions": "250", "rate": "2"},
        "no-sharing": {"requests": "900", "rate": "2", "prompt_len": "3000", "spread": "0.9"},
    }[workload]
    res = run(workload, overrides, "round_robin", fleet, trace=True)
    for replica in ("r0", "r1", "r2", "r3"):
        s = at_request(res.speed_trace, replica, 200)
        assert error(s) <= TOLERANCE, (replica, s)
