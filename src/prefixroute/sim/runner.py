"""Run several policies over one workload and score each: what ``simulate`` and ``demo`` call."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prefixroute.core import make_policy, speed_priors_of
from prefixroute.sim.cluster import ClusterSim, RunResult
from prefixroute.sim.fleet import Fleet
from prefixroute.sim.metrics import DEFAULT_TTFT_SLO_S, PolicyMetrics, oracle_floor, summarize
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workload import Workload

PROGRESS_AFTER_S = 1.0  # a progress bar appears only on runs longer than this, seconds


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


class LazyProgress:
    """A rich progress bar on stderr that appears only once a run has taken a second."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self._t0 = time.perf_counter()
        self._bar: Progress | None = None
        self._task: Any = None

    def update(self, done: int) -> None:
        if not self.enabled or done % 50:
            return
        if self._bar is None:
            if time.perf_counter() - self._t0 < PROGRESS_AFTER_S:
                return
            from rich.console import Console

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        self._bar.update(self._task, completed=done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


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
) -> Comparison:
    """Simulate ``workload`` once per policy, each on a fresh cluster with the same seed.

    ``fleet`` gives each replica its own settings (and speed changes); it replaces ``replicas``.
    ``learn_overhead``: the router learns each replica's fixed first-token overhead too (as
    the gateway's ``learn_ttft_overhead``; worth it where the fleet's overheads differ).
    ``plain``: the share of answers that are plain, not streamed; ``scrape_s``: the router
    reads the engines' prefill metrics this often, seconds (0: never); ``tell_speeds``: the
    router is given each replica's true speed as its own priors (all three ``ClusterSim``'s).
    """
    cfg = replica_config or ReplicaConfig(block_size=workload.block_size)
    if fleet is not None:
        cfg = dataclasses.replace(cfg, block_size=fleet.configs[0].block_size)
    floor = oracle_floor(workload, cfg.block_size)
    out = Comparison(workload, [])
    for name in policies:
        policy = make_policy(name, **(policy_params or {}).get(name, {}))
        speed = dataclasses.replace(speed_priors_of(policy), learn_overhead=learn_overhead)
        bar = LazyProgress(workload.num_requests, f"{workload.name} / {name}", progress)
        try:
            sim = ClusterSim(
                workload, policy, replicas, cfg, seed, bar.update, fleet,
                speed=speed, plain=plain, scrape_s=scrape_s, tell_speeds=tell_speeds,
            )  # fmt: skip
            result = sim.run()
        finally:
            bar.close()
        metrics = summarize(result, floor, ttft_slo_s)
        out.metrics.append(metrics)
        out.results.append(result)
        out.ttfts_ms[name] = [r.ttft_s * 1000.0 for r in result.records if r.ttft_s is not None]
        if on_result is not None:
            on_result(metrics)
    return out
