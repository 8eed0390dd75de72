"""The simulator at scale: the Mooncake conversation trace, tiled, on many replicas (issue 5).

Default: 100 replicas, the trace tiled 4 times (48,124 requests), about a minute. ``--full``:
1,000 replicas, tiled 84 times (1,010,604 requests). The offered load is 70% of the cluster's
prefill capacity (replicas x 10,000 tokens/s) in both, so each replica sees the same load.
Copies share no prefixes with each other (hash ids are offset per copy), so every copy is an
independent user population with the trace's own prefix structure.

Prints the workload build time, the simulation's wall time and requests per second, the router's
mean decision time, the peak resident memory of the process, and the run's cache hit rate and
TTFT percentiles. First it runs a baseline in the same process (STYLE.md rule 15;
``--no-baseline`` skips it):

* default (and ``--exact-baseline``): the same workload with predicted_ttft scoring every
  replica (its shortlist switched off), so the ratios say what the shortlist saves in decision
  time and what it costs in hit rate and TTFT;
* ``--full``: the same policy at a tenth of the replicas and copies, so the ratios say how the
  per-request cost grows with the cluster (scoring every replica of 1,000 would take hours).

Run: ``.venv/bin/python benchmarks/scale_sim.py [--full] [--policy NAME]``, or ``make bench``
(the default size).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np

from prefixroute.core import DEFAULT_POLICY, make_policy
from prefixroute.sim import ClusterSim, ReplicaConfig, make_workload

TRACE_ROWS = 12_031  # requests in the conversation trace
PREFILL_TOKENS_PER_S = 10_000.0  # the replica model's default, tokens/s


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


EXACT = {"shortlist_above": 1_000_000}  # predicted_ttft scoring every candidate


def run(
    replicas: int, copies: int, policy: str, seed: int, params: dict[str, int] | None = None
) -> dict[str, float]:
    t0 = time.perf_counter()
    workload = make_workload(
        "mooncake",
        seed,
        {
            "limit": "0",
            "copies": str(copies),
            "capacity_tokens_per_s": str(replicas * PREFILL_TOKENS_PER_S),
            "load": "0.7",
        },
    )
    build_s = time.perf_counter() - t0
    n = workload.num_requests
    label = policy + "".join(f" {k}={v}" for k, v in (params or {}).items())
    print(f"{workload.description}: {n:,} requests on {replicas:,} replicas, {label}", flush=True)
    print(f"  workload built in {build_s:.1f} s, peak RSS {peak_rss_mib():,.0f} MiB", flush=True)
    last = [time.perf_counter()]

    def progress(done: int) -> None:
        if done % 100_000 == 0:
            now = time.perf_counter()
            print(f"  {done:,} done, +{now - last[0]:.0f} s", file=sys.stderr, flush=True)
            last[0] = now

    sim = ClusterSim(
        workload,
        make_policy(policy, **(params or {})),
        replicas,
        ReplicaConfig(block_size=workload.block_size),
        seed,
        progress,
    )
    result = sim.run()
    records = result.records
    ttft = np.array([r.ttft_s for r in records if r.ttft_s is not None]) * 1000.0
    prompt = sum(r.prompt_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    decision_us = float(np.mean([r.decision_ns for r in records])) / 1000.0
    out = {
        "requests": float(n),
        "replicas": float(replicas),
        "build_s": build_s,
        "wall_s": result.wall_s,
        "requests_per_s": n / result.wall_s,
        "decision_us": decision_us,
        "events": float(result.events),
        "sim_s": result.duration_s,
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "peak_rss_mib": peak_rss_mib(),
    }
    print(
        f"  simulated {out['sim_s']:.0f} s in {out['wall_s']:.1f} s wall: "
        f"{out['requests_per_s']:,.0f} requests/s, {out['events']:,.0f} events, "
        f"decision {decision_us:.0f} us mean\n"
        f"  hit rate {out['hit_rate']:.1%}, TTFT p50 {out['ttft_p50_ms']:.0f} ms, "
        f"p99 {out['ttft_p99_ms']:.0f} ms, peak RSS {out['peak_rss_mib']:,.0f} MiB",
        flush=True,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="1,000 replicas, 1,010,604 requests")
    ap.add_argument("--replicas", type=int, help="override the replica count")
    ap.add_argument("--copies", type=int, help="override how many times the trace is tiled")
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-baseline", action="store_true", help="skip the baseline run")
    ap.add_argument(
        "--exact-baseline",
        action="store_true",
        help="baseline: the same size, every replica scored (the default unless --full)",
    )
    args = ap.parse_args(argv or [])
    replicas = args.replicas or (1000 if args.full else 100)
    copies = args.copies or (84 if args.full else 4)
    exact = args.exact_baseline or not args.full
    if exact and args.policy != "predicted_ttft":
        ap.error("the exact baseline is predicted_ttft without its shortlist")
    base = None
    if not args.no_baseline:
        if exact:
            base = run(replicas, copies, args.policy, args.seed, EXACT)
        else:
            base = run(max(1, replicas // 10), max(1, copies // 10), args.policy, args.seed)
    out = run(replicas, copies, args.policy, args.seed)
    if base is None:
        return 0
    per_request = (out["wall_s"] / out["requests"]) / (base["wall_s"] / base["requests"])
    if exact:
        print(
            f"shortlist vs scoring every replica: {per_request:.2f}x wall time per request, "
            f"{out['decision_us'] / base['decision_us']:.2f}x decision time, hit rate "
            f"{out['hit_rate']:.1%} vs {base['hit_rate']:.1%}, TTFT p50 "
            f"{out['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}x, "
            f"p99 {out['ttft_p99_ms'] / base['ttft_p99_ms']:.2f}x"
        )
    else:
        print(
            f"vs the tenth-size baseline: {out['replicas'] / base['replicas']:.0f}x replicas, "
            f"{out['requests'] / base['requests']:.1f}x requests, "
            f"{per_request:.1f}x wall time per request, "
            f"{out['decision_us'] / base['decision_us']:.1f}x decision time"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
