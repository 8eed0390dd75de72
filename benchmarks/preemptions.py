"""Preemptions: what the speed model learns on replicas that preempt, heeded and ignored.

Replicas that take KV blocks as vLLM v1 does (``--fleet ...preempt=1``, sim/preemption.py)
preempt when their caches run out, and recompute what they preempted: work no router counted.
The router hears each engine's preemption count at each scrape (``--scrape``, as a gateway does
from ``vllm:num_preemptions_total``) and takes back what it learned while they happened
(core/preemptions.py). The baseline, in the same run, is the same router with
``Router.observe_preemptions`` made a no-op: what it learned before that module.

Workload: multi-turn with longer answers (``rate=3``, ``answer_max=600``), 32k-token caches,
on four equal replicas and on two plus two 4x slower. Printed per run: each replica's learned
prefill rate against its true one, the lowest learned decode step against the true one, the
preemptions and the p50 and p99 TTFT, heeded and ignored.

Run: ``.venv/bin/python benchmarks/preemptions.py [--seeds 0,1,2,3]`` (about 40 s a run).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

from _cli import add_seeds

from prefixroute.core import DEFAULT_POLICY, Router, make_policy
from prefixroute.sim import ClusterSim, ReplicaConfig, RunResult, make_workload, parse_fleet

FLEETS = {
    "4 equal": "4:preempt=1,kv_tokens=32768",
    "2 + 2 4x slower": "2:preempt=1,kv_tokens=32768+2:preempt=1,kv_tokens=32768,prefill=2500",
}
WORKLOAD = ("multi-turn", {"rate": "3", "answer_max": "600"})  # as --set gives them
SCRAPE_S = 2.0  # seconds between scrapes, as a gateway's health rounds


@contextmanager
def preemptions_ignored() -> Iterator[None]:
    """The router as it was before core/preemptions.py: it hears no preemption."""
    Router.observe_preemptions = lambda self, replica, preemptions, now: 0  # type: ignore[method-assign]
    try:
        yield
    finally:
        del Router.observe_preemptions  # the inherited call again


def run(spec: str, seed: int) -> RunResult:
    wl = make_workload(WORKLOAD[0], seed, dict(WORKLOAD[1]))
    fleet = parse_fleet(spec, ReplicaConfig())
    return ClusterSim(wl, make_policy(DEFAULT_POLICY), fleet=fleet, seed=seed,
                      scrape_s=SCRAPE_S).run()  # fmt: skip


def cells(res: RunResult) -> list[str]:
    ttfts = sorted(r.ttft_s for r in res.records if r.ttft_s is not None)
    p99 = ttfts[int(0.99 * (len(ttfts) - 1))]
    rates = " ".join(
        f"{r.learned_prefill_tokens_per_s / r.prefill_tokens_per_s:.2f}" for r in res.replicas
    )
    step = min(r.learned_decode_step_s / r.decode_step_s for r in res.replicas)
    preempted = sum(r.preemptions for r in res.replicas)
    return [rates, f"{step:.2f}", f"{preempted:,}",
            f"{statistics.median(ttfts):.2f}", f"{p99:.2f}"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_seeds(ap, "0,1,2,3")
    args = ap.parse_args()
    print("| fleet | seed | router | learned rate x true | lowest decode step x true | "
          "preemptions | p50 s | p99 s |")  # fmt: skip
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for name, spec in FLEETS.items():
        for seed in args.seeds:
            with preemptions_ignored():
                ignored = cells(run(spec, seed))
            heeded = cells(run(spec, seed))
            for label, row in (("ignored", ignored), ("heeded", heeded)):
                print(f"| {name} | {seed} | {label} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
