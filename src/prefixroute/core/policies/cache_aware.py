"""cache_aware: the SGLang router's cache-aware policy.

Source: sgl-project/sglang, ``sgl-router/src/policies/cache_aware.rs``. It routes on characters
(our default hashing unit). Load is the router's own count of requests in flight to a worker.
Defaults are the router CLI's (``router_args.py``); the Rust struct's defaults differ.

    imbalanced = max_load - min_load > balance_abs_threshold
                 and max_load > min_load * balance_rel_threshold
    if imbalanced:              the least-loaded worker
    elif match_rate > cache_threshold:   the worker with the longest prefix match
    else:                       the worker with the smallest tree (most cache room)

Newer sgl-model-gateway versions pick the least-loaded worker on a weak match instead of the
smallest tree; we keep the sgl-router behaviour. SGLang returns an arbitrary worker among equal
longest matches; we take the least loaded of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.policies._base import (
    RoutingContext,
    in_flight_range,
    least_loaded_of,
    match_rate,
    matching,
    smallest_trees,
)
from prefixroute.core.policies._params import ranged
from prefixroute.core.types import Decision, DecisionReason


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    # matched fraction of the prompt needed to follow the cache
    cache_threshold: float = ranged(0.3, 0.0, 1.0)
    balance_abs_threshold: int = ranged(64, 0)  # load gap (requests) that may trigger balancing
    balance_rel_threshold: float = ranged(1.5, 0.0)  # and max load must exceed min load times this


@dataclass(slots=True)
class CacheAware:
    name: ClassVar[str] = "cache_aware"
    config: CacheAwareConfig = field(default_factory=CacheAwareConfig)

    def decide(self, ctx: RoutingContext) -> Decision:
        cfg = self.config
        lo, hi = in_flight_range(ctx)
        if hi - lo > cfg.balance_abs_threshold and hi > lo * cfg.balance_rel_threshold:
            return ctx.decide(least_loaded_of(ctx, ctx.candidates), DecisionReason.LOAD_IMBALANCE)
        longest, rate = match_rate(ctx)
        if longest > 0 and rate > cfg.cache_threshold:
            best = matching(ctx, longest)
            return ctx.decide(least_loaded_of(ctx, best), DecisionReason.PREFIX_MATCH)
        return ctx.decide(least_loaded_of(ctx, smallest_trees(ctx)), DecisionReason.WEAK_MATCH)
