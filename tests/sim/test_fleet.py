"""Tests for prefixroute.sim.fleet: per-replica settings, speed changes, and the model's speeds."""

from __future__ import annotations

import pytest

from prefixroute.core import ConfigError
from prefixroute.sim.fleet import (
    Fleet,
    SpeedChange,
    fleet_from_flags,
    parse_fleet,
    parse_speed_change,
)
from prefixroute.sim.replica import EngineRequest, ReplicaConfig, ReplicaModel

BASE = ReplicaConfig()


def test_groups_override_the_base_settings() -> None:
    fleet = parse_fleet("2+1:prefill=2500,decode_ms=30+1:kv_tokens=65536,max_running=8", BASE)
    assert fleet.size == 4
    assert fleet.names == ["r0", "r1", "r2", "r3"]
    assert fleet.configs[0] == fleet.configs[1] == BASE
    assert fleet.configs[2].prefill_tokens_per_s == 2500.0
    assert fleet.configs[2].decode_step_s == pytest.approx(0.030)
    assert fleet.configs[3].kv_capacity_blocks == 65536 // BASE.block_size
    assert fleet.configs[3].max_running == 8
    assert fleet.config_of("r2", BASE) is fleet.configs[2]
    assert fleet.config_of("r9", BASE) is BASE  # a replica the fleet lacks (added later)
    assert "r2: 2,500 tok/s" in fleet.describe()


@pytest.mark.parametrize(
    "spec",
    ["", " ", "x", "0", "2:speed=3", "2:prefill", "2:prefill=fast", "2:prefill=-1",
     # integer settings were cut without a word: to 1,000 tokens, or to no KV block at all
     "2:kv_tokens=1000.5", "2:kv_tokens=10", "2:max_running=2.5", "2:step_tokens=nan",
     "2:kv_tokens=inf"],
)
def test_bad_fleets_are_rejected(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_fleet(spec, BASE)


def test_speed_changes_parse_and_apply() -> None:
    change = parse_speed_change("r1@60:prefill=2500,decode_ms=20")
    assert change == SpeedChange(60.0, "r1", 2500.0, 0.02)
    changed = change.apply(BASE)
    assert (changed.prefill_tokens_per_s, changed.decode_step_s) == (2500.0, 0.02)
    assert changed.kv_capacity_blocks == BASE.kv_capacity_blocks
    assert parse_speed_change("r0@1.5:prefill=100").decode_step_s is None
    for bad in ("r1:prefill=1", "r1@x:prefill=1", "r1@5:kv_tokens=1", "@5:prefill=1"):
        with pytest.raises(ConfigError):
            parse_speed_change(bad)


def test_a_change_must_name_a_replica_of_the_fleet() -> None:
    with pytest.raises(ConfigError, match="r7"):
        fleet_from_flags("2+2", ["r7@5:prefill=10"], 4, BASE)
    fleet = fleet_from_flags(None, ["r3@5:prefill=10"], 4, BASE)  # --replicas 4, plain
    assert fleet.size == 4 and fleet.changes[0].replica == "r3"
    assert Fleet.uniform(3, BASE).configs == (BASE,) * 3


def test_mixed_block_sizes_are_rejected() -> None:
    with pytest.raises(ConfigError, match="block size"):
        Fleet((BASE, ReplicaConfig(block_size=32)))


def _ttft(model: ReplicaModel, prompt: int, now: float = 0.0) -> float:
    model.submit(EngineRequest(f"q{now}", list(range(prompt)), 1, arrival_s=now))
    t = now
    while model.has_work():
        t += model.begin_step(t)
        model.end_step(t)
    return t - now


def test_a_replica_runs_at_its_own_speed_and_changes_speed_between_steps() -> None:
    cfg = ReplicaConfig(block_size=1, step_tokens=1000)
    fast, slow = ReplicaModel(cfg), ReplicaModel(parse_fleet("1:prefill=2500", cfg).configs[0])
    assert _ttft(fast, 1000) == pytest.approx(0.1)
    assert _ttft(slow, 1000) == pytest.approx(0.4)
    model = ReplicaModel(cfg)
    model.submit(EngineRequest("a", list(range(10_000, 12_000)), 1, arrival_s=0.0))
    first = model.begin_step(0.0)  # planned at 10,000 tokens/s
    model.set_speed(prefill_tokens_per_s=2500.0)
    model.end_step(first)
    assert first == pytest.approx(0.1)
    assert model.begin_step(first) == pytest.approx(0.4)  # the next step runs at the new speed
