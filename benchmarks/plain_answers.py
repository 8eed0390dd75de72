"""Plain answers: how the default does when some or all clients do not stream.

A plain (non-streamed) answer arrives whole, so the router sees no first token: it guesses one
when due at the replica's learned speed (``Router.first_token_due``, once that speed is the
replica's own) and learns from the whole answer's time (``complete(..., whole=True)``). The
fleet is ``heterogeneous.py``'s (r0-r1 prefill 20,000 tokens/s, r2-r3 5,000); every workload
and seed runs the default policy with 0, half and all of its answers plain, beside
least_loaded and cache_aware, which read no first token, so their results hold for any share.

Printed per run: p50 and p99 TTFT, prefill against the oracle floor, and the worst error of a
replica's prefill rate as the router holds it at the end against its true one. One more row
per workload and seed has every answer plain and each replica's true speed given to the router
as its own priors (``ClusterSim(tell_speeds=True)``, what ``--replica-speed`` does in a
gateway).
The baseline of the same run is the streamed default (share 0). ``--fleet`` runs another fleet
(``prefixroute simulate --fleet``'s spec), e.g. ``4:prefill=10000`` for four equal replicas.
``--scrape S``: the router also reads the engines' prefill metrics every ``S`` seconds, as a
gateway in front of vLLM does (sim/scrape.py; the only speed source of a fleet whose answers
are all plain).

Run: ``.venv/bin/python benchmarks/plain_answers.py [--seeds 0,1] [--fleet SPEC] [--scrape S]``
(about four minutes).
"""

from __future__ import annotations

import argparse
import statistics

from _cli import add_seeds
from heterogeneous import FLEET, WORKLOADS  # the same fleet and workloads

from prefixroute.core import DEFAULT_POLICY, ConfigError, make_policy
from prefixroute.sim import (
    ClusterSim,
    ReplicaConfig,
    RunResult,
    make_workload,
    oracle_floor,
    parse_fleet,
    summarize,
)

SHARES = (0.0, 0.5, 1.0)  # of the answers plain
BASELINES = ("least_loaded", "cache_aware")


def rate_error(result: RunResult) -> float:
    """The worst ``|held / true - 1|`` of the prefill rate the router holds for a replica at
    the end of the run, learned or not (a prior, or its fleet's, is judged alike)."""
    return max(
        abs(r.learned_prefill_tokens_per_s / r.prefill_tokens_per_s - 1) for r in result.replicas
    )


def row(
    workload: str,
    seed: int,
    label: str,
    policy: str,
    share: float,
    spec: str = FLEET,
    scrape_s: float = 0.0,
    told: bool = False,
) -> list[str]:
    wl = make_workload(workload, seed, {})
    fleet = parse_fleet(spec, ReplicaConfig())
    sim = ClusterSim(
        wl, make_policy(policy), fleet=fleet, seed=seed, plain=share, scrape_s=scrape_s,
        tell_speeds=told,
    )  # fmt: skip
    res = sim.run()
    metrics = summarize(res, oracle_floor(wl, res.block_size))
    ttfts = sorted(r.ttft_s for r in res.records if r.ttft_s is not None)
    p99 = ttfts[int(0.99 * (len(ttfts) - 1))] * 1000
    error = rate_error(res) if policy == DEFAULT_POLICY else None
    return [
        workload, str(seed), label,
        f"{statistics.median(ttfts) * 1000:.0f}", f"{p99:.0f}",
        f"{metrics.floor_ratio:.2f}" if metrics.floor_ratio is not None else "-",
        f"{error:.0%}" if error is not None else "-",
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_seeds(ap, "0,1")
    ap.add_argument("--fleet", default=FLEET, help=f"the fleet (default {FLEET})")
    ap.add_argument(
        "--scrape",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds between engine-metric scrapes (default 0: none)",
    )
    args = ap.parse_args()
    try:
        parse_fleet(args.fleet, ReplicaConfig())
    except ConfigError as exc:
        ap.error(str(exc))
    if not 0.0 <= args.scrape < float("inf"):
        ap.error(f"--scrape is 0 or a number of seconds, got {args.scrape}")
    print("| workload | seed | router | p50 ms | p99 ms | x floor | worst rate error |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for workload in WORKLOADS:
        for seed in args.seeds:
            for share in SHARES:
                label = f"{DEFAULT_POLICY}, {share:.0%} plain"
                cells = row(workload, seed, label, DEFAULT_POLICY, share, args.fleet, args.scrape)
                print("| " + " | ".join(cells) + " |", flush=True)
            # Each replica's true speed given as its own priors (--replica-speed).
            label = f"{DEFAULT_POLICY}, 100% plain, speeds told"
            cells = row(workload, seed, label, DEFAULT_POLICY, 1.0, args.fleet, args.scrape, True)
            print("| " + " | ".join(cells) + " |", flush=True)
            for name in BASELINES:
                cells = row(workload, seed, name, name, 0.0, args.fleet, args.scrape)
                print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
