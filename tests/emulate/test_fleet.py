"""Emulated replicas with per-replica speeds: the same fleet settings as the simulator."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from prefixroute.commands.emulate import add_parser, config_from_args, fleet_from_args
from prefixroute.core import ConfigError
from prefixroute.emulate import EmulatedCluster, EmulatorConfig, EngineLoop
from prefixroute.sim.fleet import SpeedChange, parse_fleet
from prefixroute.sim.replica import ReplicaConfig, ReplicaModel

CFG = ReplicaConfig(block_size=1, step_tokens=1000)


def test_each_replica_gets_its_own_engine_and_changes() -> None:
    fleet = parse_fleet("1+1:prefill=2500,decode_ms=30", CFG).with_changes(
        [SpeedChange(5.0, "r1", 1000.0), SpeedChange(9.0, "r0", decode_step_s=0.02)]
    )
    cluster = EmulatedCluster(2, EmulatorConfig(CFG), fleet)
    r0, r1 = (r.config for r in cluster.replicas)
    assert r0.engine == CFG
    assert (r1.engine.prefill_tokens_per_s, r1.engine.decode_step_s) == (2500.0, 0.03)
    assert [c.at_s for c in r0.speed_changes] == [9.0]
    assert [c.prefill_tokens_per_s for c in r1.speed_changes] == [1000.0]
    with pytest.raises(ConfigError, match="fleet has 2"):
        EmulatedCluster(3, EmulatorConfig(CFG), fleet)


async def test_a_speed_change_applies_at_its_model_time() -> None:
    model = ReplicaModel(CFG)
    engine = EngineLoop(model, time_scale=0.001, speed_changes=[SpeedChange(5.0, "r0", 2500.0)])
    engine.start()
    try:
        assert model.config.prefill_tokens_per_s == 10_000.0
        async with asyncio.timeout(5):
            while model.config.prefill_tokens_per_s != 2500.0:  # 5 model s = 5 ms of wall time
                await asyncio.sleep(0.001)
    finally:
        await engine.stop()


def test_command_line_fleet() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["emulate", "--fleet", "2+2:prefill=2500", "--speed-change", "r3@30:prefill=1000"]
    )
    fleet = fleet_from_args(args, config_from_args(args))
    assert fleet is not None and fleet.size == 4
    assert fleet.configs[3].prefill_tokens_per_s == 2500.0
    assert fleet.changes == (SpeedChange(30.0, "r3", 1000.0),)
    plain = parser.parse_args(["emulate", "--count", "3"])
    assert fleet_from_args(plain, config_from_args(plain)) is None
