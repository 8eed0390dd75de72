"""Simulator speed: simulated requests per wall-clock second at 16 replicas.

Baseline measured in the same run: the same workload under round_robin (routing that does no
index lookup, so the ratio shows what cache-aware routing costs the simulator), and the kernel
alone pushing the same number of no-op events (the floor any event-driven design pays).
Target from issue 2: 20,000 simulated requests per second.
"""

from __future__ import annotations

import time

from prefixroute.core import make_policy
from prefixroute.sim.cluster import ClusterSim
from prefixroute.sim.kernel import Kernel
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload

TARGET_RPS = 20_000
REPLICAS = 16
CASES = (
    # workload, overrides scaled to 16 replicas (4x the 4-replica defaults' rate)
    ("multi-turn", {"sessions": "2000", "rate": "17.2"}),
    ("mooncake", {"limit": "8000", "capacity_tokens_per_s": "160000"}),
    ("no-sharing", {"requests": "8000", "rate": "108"}),
)


def kernel_floor(events: int) -> float:
    k = Kernel()
    for i in range(events):
        k.at(i * 1e-3, lambda: None)
    t0 = time.perf_counter()
    k.run()
    return events / (time.perf_counter() - t0)


def main() -> None:
    print(f"## simulator speed, {REPLICAS} replicas (simulated requests per wall second)")
    for name, overrides in CASES:
        workload = make_workload(name, 0, overrides)
        row = []
        rates = {}
        events = 0
        for policy in ("round_robin", "predicted_ttft"):
            res = ClusterSim(workload, make_policy(policy), REPLICAS, ReplicaConfig(), 0).run()
            rates[policy] = len(res.records) / res.wall_s
            events = res.events
            row.append(f"{policy} {rates[policy]:8,.0f}/s")
        per_req = events / workload.num_requests
        floor = kernel_floor(events) / per_req
        print(
            f"  {name:<11} {workload.num_requests:>6,} req  " + "  ".join(row)
            + f"  | ratio to round_robin x{rates['predicted_ttft'] / rates['round_robin']:.2f}"
            + f"  | kernel-only floor {floor:9,.0f}/s ({per_req:.1f} events/req)"
            + f"  | vs target x{rates['predicted_ttft'] / TARGET_RPS:.2f}"
        )


if __name__ == "__main__":
    main()
