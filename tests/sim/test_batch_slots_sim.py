"""Batch slots in the simulator (core/batch_slots.py): the router learns a full batch's size
from the engines' reports, or is told it (``tell_speeds``), and a told size keeps the default
policy from queueing conversations behind full batches."""

from __future__ import annotations

from prefixroute.core import DEFAULT_POLICY, make_policy
from prefixroute.sim.cluster import ClusterSim
from prefixroute.sim.fleet import parse_fleet
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload

CFG = ReplicaConfig(block_size=16)
# 100 conversations on engines of 8 slots each: the batches fill now and then.
SMALL_BATCHES = "2:max_running=8+2:prefill=2500,max_running=8"


def _sim(fleet: str, told: bool, **params: object) -> ClusterSim:
    w = make_workload("multi-turn", 0, {"sessions": "100"})
    policy = make_policy(DEFAULT_POLICY, **params)
    return ClusterSim(w, policy, fleet=parse_fleet(fleet, CFG), tell_speeds=told)


def _p99(sim: ClusterSim) -> float:
    ttfts = sorted(r.ttft_s for r in sim.run().records if r.ttft_s is not None)
    return ttfts[int(0.99 * (len(ttfts) - 1))]


def test_the_router_learns_each_full_batch_s_size_and_no_other() -> None:
    sim = _sim(SMALL_BATCHES, told=False)
    sim.run()
    learned = [sim._router.replica_load(f"r{i}").slots.size for i in range(4)]
    assert set(learned) <= {None, 8}, learned
    assert 8 in learned, learned


def test_told_sizes_are_taken_as_given() -> None:
    sim = _sim(SMALL_BATCHES, told=True)
    sim.run()
    assert [sim._router.replica_load(f"r{i}").slots.size for i in range(4)] == [8] * 4


def test_a_told_batch_size_keeps_the_tail_out_of_full_batches() -> None:
    """Without the slot term, a conversation's next turn follows its prefix into a full batch
    and waits there for running requests to finish."""
    fleet = "4:max_running=8"
    assert _p99(_sim(fleet, told=True)) < 0.5 * _p99(_sim(fleet, told=True, batch_slots=False))
