"""Heterogeneous fleet: does calibrated routing win when half the replicas prefill 4x slower?

The fleet of issue 11's outside test: r0-r1 prefill 20,000 tokens/s, r2-r3 5,000 (same 15 ms
decode step and 131,072-token KV cache), under the four workloads' default load (sized for 4 x
10,000 tokens/s, so about 56% of this fleet). Every policy runs on the same workload and seed:
round_robin, least_loaded, cache_aware (the routers the issue compares against), the default
``predicted_ttft`` (speeds learned per replica) and, for reference, ``predicted_ttft`` with the
fixed constants (``learned_speeds=False``, the policy before issue 11).

Targets (issue 11): the default's p99 TTFT <= 0.8x the best of round_robin, least_loaded and
cache_aware on every workload, <= 0.7x on mooncake, and prefill <= 1.1x the oracle floor on the
workloads that share prefixes (multi-turn, hot-prefix, mooncake).

Then the speed model itself: on each workload, with the default policy, replica r0 slows from
20,000 to 5,000 tokens/s halfway through the arrivals; the trace follows the router's estimate
of r0 against its true rate. Target: within 15% at r0's 200th request, and again at its 200th
request after the change (the table also shows the worst error after each of those points).

Run: ``.venv/bin/python benchmarks/heterogeneous.py [--seeds 0,1,2] [--plot out/speed.png]``
(about two minutes on 4 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _cli import add_seeds

from prefixroute.core import DEFAULT_POLICY, make_policy
from prefixroute.sim import (
    ClusterSim,
    Fleet,
    ReplicaConfig,
    SpeedChange,
    SpeedSample,
    make_workload,
    oracle_floor,
    parse_fleet,
    summarize,
)

FLEET = "2:prefill=20000+2:prefill=5000"
WORKLOADS = ("multi-turn", "hot-prefix", "mooncake", "no-sharing")
SHARED = ("multi-turn", "hot-prefix", "mooncake")  # workloads whose prefill has a floor to meet
BASELINES = ("round_robin", "least_loaded", "cache_aware")
FIXED = "predicted_ttft (fixed speeds)"
# label -> (policy, parameters)
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    **{name: (name, {}) for name in BASELINES},
    DEFAULT_POLICY: (DEFAULT_POLICY, {}),
    FIXED: (DEFAULT_POLICY, {"learned_speeds": False}),
}
P99_TARGET = {"mooncake": 0.7}  # default p99 / best baseline p99; 0.8 elsewhere
FLOOR_TARGET = 1.1
SPEED_TOLERANCE = 0.15  # learned within 15% of true
SPEED_REQUESTS = 200  # ... after this many of the replica's requests
TRACED = "r0"
SLOW_TO = 5_000.0  # r0's prefill rate after the change, tokens/s


@dataclass(frozen=True, slots=True)
class Row:
    workload: str
    seed: int
    label: str
    p99_ms: float
    floor_ratio: float
    requests: dict[str, int]  # per replica
    learned: dict[str, float]  # per replica, tokens/s


def fleet_for(workload: str) -> tuple[Fleet, int]:
    block = make_workload(workload, 0).block_size
    return parse_fleet(FLEET, ReplicaConfig(block_size=block)), block


def one(job: tuple[str, int, str]) -> Row:
    workload_name, seed, label = job
    workload = make_workload(workload_name, seed)
    fleet, block = fleet_for(workload_name)
    policy, params = POLICIES[label]
    base = ReplicaConfig(block_size=block)
    sim = ClusterSim(workload, make_policy(policy, **params), seed=seed, fleet=fleet,
                     replica_config=base)  # fmt: skip
    result = sim.run()
    m = summarize(result, oracle_floor(workload, block))
    return Row(
        workload_name, seed, label, m.ttft_ms["p99"], m.floor_ratio or 0.0,
        m.per_replica_requests,
        {r: s["learned_prefill_tokens_per_s"] for r, s in (m.per_replica_speed or {}).items()},
    )  # fmt: skip


def traced(workload_name: str) -> tuple[str, float, list[SpeedSample]]:
    """The default policy with r0 slowing to SLOW_TO at the median arrival; r0's samples."""
    workload = make_workload(workload_name, 0)
    starts = sorted(s.start_s for s in workload.by_start())
    at = round(starts[len(starts) // 2], 1)
    fleet, block = fleet_for(workload_name)
    fleet = fleet.with_changes([SpeedChange(at, TRACED, prefill_tokens_per_s=SLOW_TO)])
    sim = ClusterSim(
        workload, make_policy(DEFAULT_POLICY), seed=0, fleet=fleet,
        replica_config=ReplicaConfig(block_size=block), trace_speeds=True,
    )  # fmt: skip
    result = sim.run()
    return workload_name, at, [s for s in result.speed_trace if s.replica == TRACED]


def _error(s: SpeedSample) -> float:
    return abs(s.learned_prefill_tokens_per_s / s.prefill_tokens_per_s - 1.0)


def first_within(samples: list[SpeedSample]) -> int | None:
    """Requests until the estimate is first within tolerance (None: never)."""
    return next((i + 1 for i, s in enumerate(samples) if _error(s) <= SPEED_TOLERANCE), None)


def _at(samples: list[SpeedSample], n: int) -> SpeedSample | None:
    """The sample after the replica's ``n``-th request (the last if fewer came)."""
    return samples[min(n, len(samples)) - 1] if samples else None


def report_runs(rows: list[Row], seeds: list[int]) -> bool:
    table = {(r.workload, r.seed, r.label): r for r in rows}
    labels = list(POLICIES)
    print(f"## p99 TTFT (ms) on the heterogeneous fleet ({FLEET}), seeds {seeds}")
    print()
    print("| workload | seed | " + " | ".join(labels) + " | default / best baseline | "
          "default x floor | verdict |")  # fmt: skip
    print("|---|---|" + "---:|" * len(labels) + "---:|---:|---|")
    ok = True
    for w in WORKLOADS:
        per_seed: dict[str, list[float]] = {label: [] for label in labels}
        floors = []
        for seed in seeds:
            cells = []
            for label in labels:
                r = table[(w, seed, label)]
                per_seed[label].append(r.p99_ms)
                cells.append(f"{r.p99_ms:.0f}")
            ours = table[(w, seed, DEFAULT_POLICY)]
            best = min(table[(w, seed, b)].p99_ms for b in BASELINES)
            floors.append(ours.floor_ratio)
            verdict = _verdict(w, ours.p99_ms / best, ours.floor_ratio)
            print(f"| {w} | {seed} | " + " | ".join(cells) + f" | {ours.p99_ms / best:.2f} | "
                  f"{ours.floor_ratio:.2f} | {verdict} |")  # fmt: skip
        mean = {label: statistics.fmean(v) for label, v in per_seed.items()}
        best = min(mean[b] for b in BASELINES)
        ratio = mean[DEFAULT_POLICY] / best
        verdict = _verdict(w, ratio, max(floors))
        ok &= verdict == "met"
        cells = [f"{mean[label]:.0f}" for label in labels]
        print(f"| {w} | mean | " + " | ".join(cells) + f" | **{ratio:.2f}** | "
              f"{max(floors):.2f} | **{verdict}** |")  # fmt: skip
    print()
    return ok


def _verdict(workload: str, ratio: float, floor: float) -> str:
    limit = P99_TARGET.get(workload, 0.8)
    misses = []
    if ratio > limit:
        misses.append(f"p99 > {limit}x")
    if workload in SHARED and floor > FLOOR_TARGET:
        misses.append(f"prefill > {FLOOR_TARGET}x floor")
    return "met" if not misses else "missed: " + ", ".join(misses)


def report_balance(rows: list[Row], seed: int) -> None:
    print(f"## requests per replica and learned prefill rate (seed {seed}; r0-r1 fast, r2-r3 slow)")
    print()
    print("| workload | policy | requests r0 r1 r2 r3 | to slow | learned tok/s r0 r1 r2 r3 |")
    print("|---|---|---|---:|---|")
    for w in WORKLOADS:
        for label in (DEFAULT_POLICY, FIXED, "cache_aware"):
            r = next(x for x in rows if (x.workload, x.seed, x.label) == (w, seed, label))
            reqs = [r.requests.get(f"r{i}", 0) for i in range(4)]
            learned = " ".join(f"{r.learned.get(f'r{i}', 0):,.0f}" for i in range(4))
            slow = (reqs[2] + reqs[3]) / max(1, sum(reqs))
            print(f"| {w} | {label} | {' '.join(map(str, reqs))} | {slow:.0%} | {learned} |")
    print()


def report_traces(traces: list[tuple[str, float, list[SpeedSample]]]) -> bool:
    print(f"## learned vs true prefill rate of {TRACED} (20,000 -> {SLOW_TO:,.0f} tokens/s at "
          "the median arrival), default policy, seed 0")  # fmt: skip
    print()
    print(f"| workload | change at s | {TRACED} requests before / after | error at "
          f"{SPEED_REQUESTS}th | max error {SPEED_REQUESTS}th..change | after the change: first "
          f"within 15% | error at {SPEED_REQUESTS}th after | max error after that | verdict |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    ok = True
    for w, at, samples in traces:
        before = [s for s in samples if s.prefill_tokens_per_s != SLOW_TO]
        after = [s for s in samples if s.prefill_tokens_per_s == SLOW_TO]
        at_n, again = _at(before, SPEED_REQUESTS), _at(after, SPEED_REQUESTS)
        settled = [_error(s) for s in before[SPEED_REQUESTS - 1 :]]
        late = [_error(s) for s in after[SPEED_REQUESTS - 1 :]]
        first = first_within(after)
        met = (
            at_n is not None and _error(at_n) <= SPEED_TOLERANCE
            and again is not None and _error(again) <= SPEED_TOLERANCE
        )  # fmt: skip
        ok &= met
        print(f"| {w} | {at:g} | {len(before)} / {len(after)} | "
              f"{'-' if at_n is None else f'{_error(at_n):.1%}'} | "
              f"{f'{max(settled):.1%}' if settled else '-'} | "
              f"{'never' if first is None else first} | "
              f"{'-' if again is None else f'{_error(again):.1%}'} | "
              f"{f'{max(late):.1%}' if late else '-'} | "
              f"{'met' if met else 'missed'} |")  # fmt: skip
    print()
    w, at, samples = next(t for t in traces if t[0] == "mooncake")
    print(f"### trace: mooncake, every 25th request of {TRACED}")
    print()
    print("| request | time s | true tok/s | learned tok/s | error | learned decode ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i, s in enumerate(samples):
        if (i + 1) % 25 == 0 or i == len(samples) - 1:
            print(f"| {s.requests} | {s.time_s:.1f} | {s.prefill_tokens_per_s:,.0f} | "
                  f"{s.learned_prefill_tokens_per_s:,.0f} | {_error(s):.1%} | "
                  f"{s.learned_decode_step_s * 1000:.1f} |")  # fmt: skip
    print()
    return ok


def plot(traces: list[tuple[str, float, list[SpeedSample]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.6), squeeze=False)
    for ax, (w, at, samples) in zip(axes[0], traces, strict=True):
        t = [s.time_s for s in samples]
        ax.plot(t, [s.prefill_tokens_per_s for s in samples], label="true", color="black")
        ax.plot(t, [s.learned_prefill_tokens_per_s for s in samples], label="learned")
        ax.axvline(at, linestyle=":", color="grey")
        ax.set_title(w)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(f"{TRACED} prefill tokens/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_seeds(p, "0,1,2")
    p.add_argument("--plot", type=Path, help="write the speed traces as a PNG")
    args = p.parse_args(argv if argv is not None else [])
    seeds: list[int] = args.seeds
    jobs = [(w, s, label) for w in WORKLOADS for s in seeds for label in POLICIES]
    with ProcessPoolExecutor() as pool:
        rows = list(pool.map(one, jobs))
        traces = list(pool.map(traced, WORKLOADS))
    ok = report_runs(rows, seeds)
    report_balance(rows, seeds[0])
    ok &= report_traces(traces)
    if args.plot:
        plot(traces, args.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
