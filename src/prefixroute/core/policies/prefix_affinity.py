"""prefix_affinity: Ray Serve's PrefixCacheAffinityRouter.

Source: ray-project/ray 2.60, ``python/ray/llm/_internal/serve/routing_policies/prefix_aware/``
(``initialize_state`` defaults: ``imbalanced_threshold=inf``, ``match_rate_threshold=0.1``).

1. If the highest minus the lowest queue length (ongoing requests) among candidates exceeds
   ``imbalanced_threshold`` (strictly), ignore the cache: two random candidates.
2. Otherwise find the longest prefix match. If ``matched / prompt`` (characters in Ray; our
   hashing units here) is at least ``match_rate_threshold``, the set is the best-matching
   replicas; below it, the replicas with the smallest trees (the most free cache).
3. The lowest queue in the set wins; ties go to the first in candidate order.

Ray builds its text by concatenating message contents without roles; we route on our own block
hashes of the request (roles included), so the two can differ on chat prompts that share text but
not roles. Ray's tree eviction is off by default; our index's LRU capacity stands in for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.policies._base import (
    RoutingContext,
    in_flight_range,
    match_rate,
    matching,
    smallest_trees,
)
from prefixroute.core.policies._params import ranged
from prefixroute.core.types import Decision, DecisionReason, ReplicaId


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig:
    # Queue-length difference (requests) that disables affinity. Ray 2.60's default is infinite:
    # it never falls back to load (Ray's docs show 10 or 20 set by hand).
    imbalanced_threshold: float = ranged(math.inf, 0.0)
    # matched fraction of the prompt below which it is a miss
    match_rate_threshold: float = ranged(0.1, 0.0, 1.0)


@dataclass(slots=True)
class PrefixAffinity:
    name: ClassVar[str] = "prefix_affinity"
    config: PrefixAffinityConfig = field(default_factory=PrefixAffinityConfig)

    def decide(self, ctx: RoutingContext) -> Decision:
        cfg = self.config
        lo, hi = in_flight_range(ctx)
        if hi - lo > cfg.imbalanced_threshold:
            pair = ctx.rng.sample(list(ctx.candidates), min(2, len(ctx.candidates)))
            return ctx.decide(_shortest_queue(ctx, pair), DecisionReason.LOAD_IMBALANCE)
        longest, rate = match_rate(ctx)
        if longest > 0 and rate >= cfg.match_rate_threshold:
            pool, reason = matching(ctx, longest), DecisionReason.PREFIX_MATCH
        else:
            pool, reason = smallest_trees(ctx), DecisionReason.WEAK_MATCH
        return ctx.decide(_shortest_queue(ctx, pool), reason)


def _shortest_queue(ctx: RoutingContext, pool: list[ReplicaId]) -> ReplicaId:
    """Ray's final pick: the strictly lowest queue, the first one on ties."""
    return min(pool, key=lambda r: ctx.load(r).in_flight)
