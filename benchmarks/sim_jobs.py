"""A comparison's runs in worker processes (``simulate --jobs``) against one at a time, in the
same run.

Every policy on a workload at its defaults, 4 replicas: ``compare_policies(jobs=0)`` (one worker
per usable CPU) and ``compare_policies(jobs=1)`` (in this process), alternated, two rounds. Prints
each wall time, the speedup, and whether the two gave the same scores (every figure but the
measured decision times). One simulation stays one process; this is what a comparison or a
sweep gains from the cores a machine has (issue 15: runs fast enough for policy research).

Run: ``.venv/bin/python benchmarks/sim_jobs.py [--quick]`` (``--quick``: one workload, one round).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from prefixroute.core import policy_names
from prefixroute.sim import Comparison, compare_policies, make_workload, usable_cpus

WORKLOADS = ("multi-turn", "mooncake")


def timed(name: str, jobs: int) -> tuple[float, Comparison]:
    workload = make_workload(name, 0)
    t0 = time.perf_counter()
    cmp = compare_policies(workload, policy_names(), progress=False, jobs=jobs)
    return time.perf_counter() - t0, cmp


def scores(cmp: Comparison) -> list[dict[str, object]]:
    return [
        {k: v for k, v in dataclasses.asdict(m).items() if k != "decision_us"} for m in cmp.metrics
    ]


def main(argv: list[str] | None = None) -> int:
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    cpus = usable_cpus()
    rounds = 1 if quick else 2
    print(f"## {len(policy_names())} policies per workload: {cpus} workers against 1, same run")
    for name in WORKLOADS[:1] if quick else WORKLOADS:
        one: list[float] = []
        many: list[float] = []
        same = True
        for _ in range(rounds):
            t1, c1 = timed(name, 1)
            tn, cn = timed(name, 0)
            one.append(t1)
            many.append(tn)
            same = same and scores(c1) == scores(cn)
        ratio = min(one) / min(many)
        print(
            f"  {name:11s} one at a time {', '.join(f'{t:.2f}' for t in one)} s | "
            f"{cpus} workers {', '.join(f'{t:.2f}' for t in many)} s | x{ratio:.2f} (best of "
            f"each) | {'same scores' if same else 'SCORES DIFFER'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
