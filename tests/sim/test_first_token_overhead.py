"""A replica's fixed first-token overhead in the simulator and the emulator (sim/replica.py's
``ReplicaConfig.first_token_overhead_s``): the cluster and the emulator hold each request that
long before its engine queues it, as a real server's HTTP exchange, tokenizing and templating
do; ``--fleet ...:overhead_ms=N`` sets it per replica; the router can learn it
(``SpeedConfig.learn_overhead``)."""

from __future__ import annotations

import json
import time

import aiohttp
import pytest

from prefixroute.cli import main
from prefixroute.core import DEFAULT_POLICY, ConfigError, SpeedConfig, make_policy
from prefixroute.emulate import EmulatedReplica, EmulatorConfig
from prefixroute.sim import ClusterSim, RunResult, make_workload, parse_fleet
from prefixroute.sim.replica import ReplicaConfig

BASE = ReplicaConfig()


def test_the_fleet_sets_it_in_milliseconds_per_replica() -> None:
    fleet = parse_fleet("1+1:overhead_ms=30", BASE)
    assert fleet.configs[0].first_token_overhead_s == 0.0
    assert fleet.configs[1].first_token_overhead_s == pytest.approx(0.030)
    assert "r1: 10,000 tok/s, 15 ms/step, 131,072 KV tokens, 30 ms before queueing" in (
        fleet.describe()
    )
    with pytest.raises(ConfigError):
        parse_fleet("2:overhead_ms=-5", BASE)
    with pytest.raises(ConfigError):
        ReplicaConfig(first_token_overhead_s=float("nan"))


def conversation(fleet: str, speed: SpeedConfig | None = None) -> RunResult:
    w = make_workload("seed-conversation", 0)
    config = ReplicaConfig(block_size=w.block_size)
    sim = ClusterSim(
        w, make_policy(DEFAULT_POLICY), seed=0, fleet=parse_fleet(fleet, config),
        replica_config=config, speed=speed,
    )  # fmt: skip
    return sim.run()


def test_every_first_token_comes_the_overhead_later() -> None:
    plain, held = conversation("1"), conversation("1:overhead_ms=30")
    assert len(plain.records) == len(held.records) == 5
    for a, b in zip(plain.records, held.records, strict=True):
        assert a.ttft_s is not None and b.ttft_s is not None
        assert b.ttft_s - a.ttft_s == pytest.approx(0.030)
        assert b.cached_tokens == a.cached_tokens


def test_the_router_learns_it_when_asked() -> None:
    overrides = {"sessions": "60", "rate": "2"}
    w = make_workload("multi-turn", 0, overrides)
    config = ReplicaConfig(block_size=w.block_size)
    fleet = parse_fleet("2:overhead_ms=40", config)

    def learned(learn: bool) -> list[float]:
        speed = SpeedConfig(learn_overhead=learn)
        sim = ClusterSim(w, make_policy(DEFAULT_POLICY), seed=0, fleet=fleet,
                         replica_config=config, speed=speed)  # fmt: skip
        return [r.learned_first_token_overhead_s for r in sim.run().replicas]

    assert learned(False) == [0.0, 0.0]
    for overhead in learned(True):
        assert overhead == pytest.approx(0.040, rel=0.25)


def test_a_request_on_its_way_to_a_removed_replica_is_routed_again() -> None:
    # r0 leaves at 20 s; requests sent to it in the 0.5 s before reach it after it left.
    overrides = {"sessions": "80", "rate": "4", "remove_replica_at_s": "20"}
    w = make_workload("multi-turn", 0, overrides)
    config = ReplicaConfig(block_size=w.block_size, first_token_overhead_s=0.5)
    result = ClusterSim(w, make_policy("round_robin"), 4, config, 0).run()
    assert all(r.finish_s is not None for r in result.records)  # nothing lost
    removed = next(r for r in result.replicas if r.replica == "r0").removed_s
    assert removed == 20.0
    late = [r for r in result.records if removed - 0.5 < r.arrival_s < removed]
    moved = [r for r in late if r.rerouted]
    assert moved and all(r.replica != "r0" for r in moved)


async def test_the_emulator_holds_each_request_for_it() -> None:
    # 2 model seconds at 0.05 wall seconds each: 0.1 s of wall time before the engine queue.
    engine = ReplicaConfig(block_size=1, first_token_overhead_s=2.0)
    async with EmulatedReplica(EmulatorConfig(engine, time_scale=0.05)) as replica:
        body = {"model": "emulated", "prompt": [1, 2, 3], "max_tokens": 1}
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            async with session.post(replica.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
            assert time.perf_counter() - start >= 0.1


def test_simulate_learns_it_with_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    def learned(*flag: str) -> list[float]:
        argv = ["simulate", "--workload", "multi-turn", "--set", "sessions=60", "--set",
                "rate=2", "--fleet", "2:overhead_ms=40", "--json", *flag]  # fmt: skip
        assert main(argv) == 0
        doc = json.loads(capsys.readouterr().out)
        speeds = doc["policies"][0]["per_replica_speed"]
        assert [s["first_token_overhead_s"] for s in speeds.values()] == [0.04, 0.04]
        return [s["learned_first_token_overhead_s"] for s in speeds.values()]

    assert learned() == [0.0, 0.0]
    for overhead in learned("--learn-ttft-overhead"):
        assert overhead == pytest.approx(0.040, rel=0.25)


def test_simulate_plain_answers(capsys: pytest.CaptureFixture[str]) -> None:
    """``--plain 1``: the router sees no first token, and plain answers alone warm no replica
    up (core/speed.py), so every rate stays the prior; ``--plain 0.5``: the streams warm each
    replica up, and its rate is learned (a fleet at 20,000 tokens/s). Before the plain answers'
    first tokens were guessed, that was 200,000 (the bound): the queues they left behind made
    every stream's first token look ten times faster than its queue. 300 requests are few,
    and the first, learned behind such queues, still weigh: 24,000 and 27,000 here."""

    def rates(share: str) -> list[float]:
        argv = ["simulate", "-w", "no-sharing", "--set", "requests=300", "-p", DEFAULT_POLICY,
                "--fleet", "2:prefill=20000", "--json", "--plain", share]  # fmt: skip
        assert main(argv) == 0
        speeds = json.loads(capsys.readouterr().out)["policies"][0]["per_replica_speed"]
        return [s["learned_prefill_tokens_per_s"] for s in speeds.values()]

    assert rates("1") == [10_000.0, 10_000.0]
    assert rates("0.5") == pytest.approx([20_000.0, 20_000.0], rel=0.4)


def test_simulate_tell_speeds(capsys: pytest.CaptureFixture[str]) -> None:
    """``--tell-speeds``: the router starts from each replica's true speed (serve's
    --replica-speed), so with every answer plain, where nothing else teaches it, it still holds
    them: 20,000 and 5,000 tokens/s, where ``--plain 1`` alone keeps the 10,000 prior."""
    argv = ["simulate", "-w", "no-sharing", "--set", "requests=300", "-p", DEFAULT_POLICY,
            "--fleet", "1:prefill=20000+1:prefill=5000", "--json", "--plain", "1",
            "--tell-speeds"]  # fmt: skip
    assert main(argv) == 0
    speeds = json.loads(capsys.readouterr().out)["policies"][0]["per_replica_speed"]
    rates = [s["learned_prefill_tokens_per_s"] for s in speeds.values()]
    assert rates == pytest.approx([20_000.0, 5_000.0], rel=0.05)
