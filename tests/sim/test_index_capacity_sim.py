"""The simulator's router learns a replica's real cache size (core/index_capacity.py)."""

from __future__ import annotations

from prefixroute.core import IndexCapacityConfig, make_policy
from prefixroute.sim import ClusterSim, ReplicaConfig, RunResult, make_workload


def _over(result: RunResult) -> int:
    """Requests that found fewer cached tokens than the router predicted."""
    return sum(1 for r in result.records if r.cached_tokens < r.predicted_cached_tokens)


def test_the_simulator_learns_a_replica_s_real_cache_size() -> None:
    """Told 4x the real KV cache, the simulator's router learns its way back towards it."""
    workload = make_workload("multi-turn", 0)
    block = workload.block_size
    config = ReplicaConfig(block_size=block, kv_capacity_blocks=32_768 // block)
    runs = {
        learn: ClusterSim(
            workload, make_policy("predicted_ttft"), 4, config, seed=0,
            index_capacity_scale=4.0, index_capacity=IndexCapacityConfig(learn=learn),
        ).run()  # fmt: skip
        for learn in (False, True)
    }
    assert all(r.index_capacity_blocks is None for r in runs[False].replicas)
    learned = [r.index_capacity_blocks / r.kv_capacity_blocks for r in runs[True].replicas
               if r.index_capacity_blocks is not None]  # fmt: skip
    assert len(learned) == 4 and max(learned) < 2.0

    assert _over(runs[True]) < _over(runs[False])
