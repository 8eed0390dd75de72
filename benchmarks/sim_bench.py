"""Simulator speed: simulated requests per wall-clock second at 16 replicas.

Baselines measured in the same run:

* the pure-Python path: the same workload and policy in a child process with
  ``PREFIXROUTE_PURE_PYTHON=1`` (no compiled hashing, index or KV block pool), so the ratio says
  what ``core/_native`` buys the simulator (issue 15);
* round_robin: routing that does no index lookup, so the ratio shows what cache-aware routing
  costs the simulator;
* the kernel alone pushing the same number of no-op events (the floor any event-driven design
  pays).

Target from issue 2: 20,000 simulated requests per second.
Run: ``.venv/bin/python benchmarks/sim_bench.py [--quick]`` (``--quick``: one case).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from prefixroute.core import CompiledKVCache, make_policy
from prefixroute.sim import ClusterSim, Kernel, ReplicaConfig, make_workload

TARGET_RPS = 20_000
REPLICAS = 16
CASES = {
    # workload: overrides scaled to 16 replicas (4x the 4-replica defaults' rate)
    "multi-turn": {"sessions": "2000", "rate": "17.2"},
    "mooncake": {"limit": "8000", "capacity_tokens_per_s": "160000"},
    "no-sharing": {"requests": "8000", "rate": "108"},
}


def kernel_floor(events: int) -> float:
    k = Kernel()
    for i in range(events):
        k.at(i * 1e-3, lambda: None)
    t0 = time.perf_counter()
    k.run()
    return events / (time.perf_counter() - t0)


def measure(name: str, policy: str) -> tuple[float, int, str]:
    """Requests per second of one run, its kernel events, and its result digest (so the two
    paths are seen to simulate the same thing)."""
    workload = make_workload(name, 0, CASES[name])
    res = ClusterSim(workload, make_policy(policy), REPLICAS, ReplicaConfig(), 0).run()
    digest = f"{sum(r.cached_tokens for r in res.records)}/{res.duration_s:.6f}"
    return len(res.records) / res.wall_s, res.events, digest


def pure_python(name: str, policy: str) -> tuple[float, str]:
    """:func:`measure` in a child process on the pure-Python path."""
    env = dict(os.environ, PREFIXROUTE_PURE_PYTHON="1")
    out = subprocess.run(
        [sys.executable, __file__, "--child", name, policy],
        env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    rate, digest = json.loads(out.stdout)
    return float(rate), str(digest)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        rate, _, digest = measure(argv[1], argv[2])
        print(json.dumps([rate, digest]))
        return
    names = list(CASES)[1:2] if "--quick" in argv else list(CASES)
    compiled = "off" if CompiledKVCache is None else "on"
    print(f"## simulator speed, {REPLICAS} replicas (simulated requests per wall second)")
    print(f"compiled hot path: {compiled}; pure Python measured in a child process, same run")
    for name in names:
        rr, _, _ = measure(name, "round_robin")
        rate, events, digest = measure(name, "predicted_ttft")
        slow, slow_digest = pure_python(name, "predicted_ttft")
        same = "same result" if digest == slow_digest else f"RESULTS DIFFER {digest} {slow_digest}"
        per_req = events / make_workload(name, 0, CASES[name]).num_requests
        floor = kernel_floor(events) / per_req
        print(
            f"  {name:<11} predicted_ttft {rate:8,.0f}/s  pure Python {slow:7,.0f}/s"
            f"  x{rate / slow:.2f} ({same})  | round_robin {rr:8,.0f}/s"
            f"  | kernel-only floor {floor:9,.0f}/s ({per_req:.1f} events/req)"
            f"  | vs target x{rate / TARGET_RPS:.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
