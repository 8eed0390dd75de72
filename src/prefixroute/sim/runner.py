"""Run several policies over one workload and score each: what ``simulate`` and ``demo`` call."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixroute.core import make_policy, speed_priors_of
from prefixroute.sim.cluster import ClusterSim, RunResult
from prefixroute.sim.fleet import Fleet
from prefixroute.sim.metrics import DEFAULT_TTFT_SLO_S, PolicyMetrics, oracle_floor, summarize
from prefixroute.sim.parallel import simulate_each, usable_cpus
from prefixroute.sim.progress import LazyProgress
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workload import Workload


@dataclass(slots=True)
class Comparison:
    """Every policy's scores on one workload, plus the raw TTFTs for plotting."""

    workload: Workload
    metrics: list[PolicyMetrics]
    ttfts_ms: dict[str, list[float]] = field(default_factory=dict)
    results: list[RunResult] = field(default_factory=list)

    def json_header(self) -> dict[str, Any]:
        return {
            "workload": self.workload.name,
            "requests": self.workload.num_requests,
            "block_size": self.results[0].block_size if self.results else None,
        }


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """One policy's simulation with everything it needs: picklable, so that a worker process
    can run it (:mod:`prefixroute.sim.parallel`)."""

    workload: Workload
    policy: str
    params: dict[str, Any]
    replicas: int
    config: ReplicaConfig
    seed: int
    fleet: Fleet | None = None
    learn_overhead: bool = False
    plain: float = 0.0
    scrape_s: float = 0.0
    tell_speeds: bool = False

    def simulate(self, progress: Callable[[int], None] | None = None) -> RunResult:
        policy = make_policy(self.policy, **self.params)
        speed = dataclasses.replace(speed_priors_of(policy), learn_overhead=self.learn_overhead)
        sim = ClusterSim(
            self.workload, policy, self.replicas, self.config, self.seed, progress, self.fleet,
            speed=speed, plain=self.plain, scrape_s=self.scrape_s, tell_speeds=self.tell_speeds,
        )  # fmt: skip
        return sim.run()


@dataclass(frozen=True, slots=True)
class ComparisonPlan:
    """The runs of one workload's comparison, checked and ready (:func:`plan_comparison`)."""

    workload: Workload
    block_size: int  # the replicas' KV block size, tokens (the oracle floor's unit)
    runs: list[PolicyRun]


def plan_comparison(
    workload: Workload,
    policies: Sequence[str],
    *,
    replicas: int = 4,
    replica_config: ReplicaConfig | None = None,
    seed: int = 0,
    policy_params: dict[str, dict[str, Any]] | None = None,
    fleet: Fleet | None = None,
    learn_overhead: bool = False,
    plain: float = 0.0,
    scrape_s: float = 0.0,
    tell_speeds: bool = False,
) -> ComparisonPlan:
    """One run per policy of ``workload``, each on a fresh cluster with the same seed (the
    arguments as :func:`compare_policies` takes them); ConfigError for a bad policy name or
    parameter, before anything runs."""
    cfg = replica_config or ReplicaConfig(block_size=workload.block_size)
    if fleet is not None:
        cfg = dataclasses.replace(cfg, block_size=fleet.configs[0].block_size)
    base = PolicyRun(workload, "", {}, replicas, cfg, seed, fleet, learn_overhead, plain,
                     scrape_s, tell_speeds)  # fmt: skip
    params = policy_params or {}
    runs = [dataclasses.replace(base, policy=n, params=params.get(n, {})) for n in policies]
    for run in runs:
        make_policy(run.policy, **run.params)
    return ComparisonPlan(workload, cfg.block_size, runs)


def run_comparisons(
    plans: Sequence[ComparisonPlan],
    *,
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
    progress: bool = True,
    on_result: Callable[[PolicyMetrics], None] | None = None,
    jobs: int = 1,
) -> Iterator[Comparison]:
    """Each plan's :class:`Comparison`, in order, each as soon as its own runs are done. Every
    run of every plan goes to one pool of ``jobs`` worker processes (0: one per usable CPU; 1:
    one after the other here), so a few policies on many workloads keep the cores as busy as
    many policies on one. The results are the same either way; ``on_result`` gets each run's
    scores in plan and policy order."""
    runs = [run for plan in plans for run in plan.runs]
    jobs = min(jobs if jobs > 0 else usable_cpus(), len(runs))
    results = _results(runs, jobs, progress)
    try:
        for plan in plans:
            floor = oracle_floor(plan.workload, plan.block_size)
            out = Comparison(plan.workload, [])
            # Not strict: ``results`` goes on into the next plans' runs.
            for run, result in zip(plan.runs, results, strict=False):
                metrics = summarize(result, floor, ttft_slo_s)
                out.metrics.append(metrics)
                out.results.append(result)
                out.ttfts_ms[run.policy] = [
                    r.ttft_s * 1000.0 for r in result.records if r.ttft_s is not None
                ]
                if on_result is not None:
                    on_result(metrics)
            yield out
    finally:
        results.close()  # a caller that stops early stops the workers too


def compare_policies(
    workload: Workload,
    policies: Sequence[str],
    *,
    replicas: int = 4,
    replica_config: ReplicaConfig | None = None,
    seed: int = 0,
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
    policy_params: dict[str, dict[str, Any]] | None = None,
    progress: bool = True,
    on_result: Callable[[PolicyMetrics], None] | None = None,
    fleet: Fleet | None = None,
    learn_overhead: bool = False,
    plain: float = 0.0,
    scrape_s: float = 0.0,
    tell_speeds: bool = False,
    jobs: int = 1,
) -> Comparison:
    """Simulate ``workload`` once per policy, each on a fresh cluster with the same seed.

    ``fleet`` gives each replica its own settings (and speed changes); it replaces ``replicas``.
    ``learn_overhead``: the router learns each replica's fixed first-token overhead too (as
    the gateway's ``learn_ttft_overhead``; worth it where the fleet's overheads differ).
    ``plain``: the share of answers that are plain, not streamed; ``scrape_s``: the router
    reads the engines' prefill metrics this often, seconds (0: never); ``tell_speeds``: the
    router is given each replica's true speed as its own priors (all three ``ClusterSim``'s).
    ``jobs``: policies simulated at once, each in a worker process (0: one per usable CPU);
    the results are the same as one at a time, and come (``on_result``) in policy order.
    """
    plan = plan_comparison(
        workload, policies, replicas=replicas, replica_config=replica_config, seed=seed,
        policy_params=policy_params, fleet=fleet, learn_overhead=learn_overhead, plain=plain,
        scrape_s=scrape_s, tell_speeds=tell_speeds,
    )  # fmt: skip
    comparisons = run_comparisons(
        [plan], ttft_slo_s=ttft_slo_s, progress=progress, on_result=on_result, jobs=jobs
    )
    (comparison,) = comparisons
    return comparison


def _results(runs: list[PolicyRun], jobs: int, progress: bool) -> Generator[RunResult, None, None]:
    """Each run's result in order: here one at a time, or ``jobs`` at a time in workers."""
    labels = [f"{run.workload.name} / {run.policy}" for run in runs]
    if jobs > 1:
        totals = [run.workload.num_requests for run in runs]
        yield from simulate_each(runs, jobs, labels, totals, progress)
        return
    for run, label in zip(runs, labels, strict=True):
        bar = LazyProgress(run.workload.num_requests, label, progress)
        try:
            yield run.simulate(bar.update)
        finally:
            bar.close()
