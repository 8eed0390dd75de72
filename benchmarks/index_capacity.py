"""Learning each replica's index capacity from reported cached tokens (issue 11, item 4).

The router in approximate mode cannot see evictions: its index forgets a replica's blocks at a
configured capacity. Here the simulator's router is told each replica's real KV cache times
``scale`` (1: the truth; 4: a gateway configured with four times the replicas' cache), with
capacity learning off and on (:mod:`prefixroute.core.index_capacity`), under the default policy.
Per run: over-predicted requests (the replica had fewer cached tokens than predicted),
predicted / actual cached tokens, the hit rate, prefill against the oracle floor, p99 TTFT, and
the learned index capacity as a multiple of the true KV cache (mean over replicas).

Multi-turn runs with a 32,768-token KV cache per replica (at the default 131,072 its four
replicas never evict, and there is nothing to learn); Mooncake with the default.

Run: ``.venv/bin/python benchmarks/index_capacity.py [--seeds 0,1]`` (under a minute).
"""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor

from _cli import add_seeds
from rich.console import Console
from rich.table import Table

from prefixroute.core import DEFAULT_POLICY, IndexCapacityConfig, make_policy
from prefixroute.sim import ClusterSim, ReplicaConfig, make_workload, oracle_floor, summarize

RUNS = (("multi-turn", 32_768), ("mooncake", 131_072))  # workload, KV cache per replica (tokens)
SCALES = (1.0, 4.0)


def one(job: tuple[str, int, float, bool, int]) -> tuple[str, float, bool, int, dict[str, float]]:
    name, kv_tokens, scale, learn, seed = job
    workload = make_workload(name, seed)
    block = workload.block_size
    sim = ClusterSim(
        workload, make_policy(DEFAULT_POLICY), 4,
        ReplicaConfig(block_size=block, kv_capacity_blocks=kv_tokens // block), seed=seed,
        index_capacity_scale=scale, index_capacity=IndexCapacityConfig(learn=learn),
    )  # fmt: skip
    result = sim.run()
    m = summarize(result, oracle_floor(workload, block))
    learned = [
        (r.index_capacity_blocks or round(r.kv_capacity_blocks * scale)) / r.kv_capacity_blocks
        for r in result.replicas
    ]
    return name, scale, learn, seed, {
        # the router predicts every request here, so neither is None (nan if one ever is)
        "over": math.nan if m.stale_rate is None else m.stale_rate,
        "ratio": math.nan if m.predicted_cached_tokens is None
        else m.predicted_cached_tokens / max(1, m.cached_tokens),
        "hit": m.hit_rate,
        "floor": m.floor_ratio or 0.0,
        "p99": m.ttft_ms["p99"],
        "capacity": sum(learned) / len(learned),
    }


def main(argv: list[str] | None = None) -> int:
    """``argv``: the flags (None: none, as ``benchmarks/run.py`` calls it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_seeds(ap, "0,1")
    args = ap.parse_args(argv if argv is not None else [])
    seeds: list[int] = args.seeds
    jobs = [(w, kv, sc, lr, s) for w, kv in RUNS for sc in SCALES for lr in (False, True)
            for s in seeds]  # fmt: skip
    with ProcessPoolExecutor() as pool:
        results = list(pool.map(one, jobs))
    table = Table(title=f"index capacity learning, {DEFAULT_POLICY}, seeds {seeds}")
    # over: requests predicted more cached tokens than they had; pred/act: predicted / actual
    # cached tokens; index: the learned index capacity as a multiple of the real KV cache.
    for col in ("workload", "told", "learn", "over", "pred/act", "hit %", "x floor", "p99 ms",
                "index"):  # fmt: skip
        table.add_column(col, justify="left" if col == "workload" else "right")
    for w, _ in RUNS:
        for sc in SCALES:
            for lr in (False, True):
                rows = [r for (n, s, le, _, r) in results if (n, s, le) == (w, sc, lr)]
                mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
                table.add_row(
                    w, f"{sc:g}x KV", "on" if lr else "off", f"{mean['over']:.1%}",
                    f"{mean['ratio']:.3f}", f"{mean['hit']:.1%}", f"{mean['floor']:.3f}",
                    f"{mean['p99']:.0f}", f"{mean['capacity']:.2f}x",
                )  # fmt: skip
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
