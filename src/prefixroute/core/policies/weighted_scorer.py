"""weighted_scorer: llm-d's default scheduling profile (gateway-api-inference-extension).

Each scorer gives every candidate a score in [0, 1]; the weighted sum's maximum wins, ties at
random (the max-score picker).

* queue scorer:   (max_q - q) / (max_q - min_q) over waiting queues, 1 for all when equal
* kv-cache-utilization scorer: 1 - kv_usage
* prefix-cache scorer:  matched blocks / prompt blocks
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.policies._base import RoutingContext
from prefixroute.core.policies._params import ranged
from prefixroute.core.types import Decision, DecisionReason, ReplicaId


@dataclass(frozen=True, slots=True)
class WeightedScorerConfig:
    queue_weight: float = ranged(2.0, 0.0)
    kv_cache_weight: float = ranged(2.0, 0.0)
    prefix_weight: float = ranged(3.0, 0.0)


@dataclass(slots=True)
class WeightedScorer:
    name: ClassVar[str] = "weighted_scorer"
    config: WeightedScorerConfig = field(default_factory=WeightedScorerConfig)

    def _queue(self, ctx: RoutingContext, r: ReplicaId) -> int:
        load = ctx.load(r)
        # Engines report waiting requests; before the first report, the router's own count.
        return load.num_waiting if load.num_waiting is not None else load.prefilling

    def decide(self, ctx: RoutingContext) -> Decision:
        cfg = self.config
        queues = {r: self._queue(ctx, r) for r in ctx.candidates}
        q_hi, q_lo = max(queues.values()), min(queues.values())
        blocks = len(ctx.request.block_hashes)
        matches = ctx.matches
        best_score = float("-inf")
        best: list[ReplicaId] = []
        for r in ctx.candidates:
            q_score = 1.0 if q_hi == q_lo else (q_hi - queues[r]) / (q_hi - q_lo)
            kv_score = 1.0 - (ctx.load(r).kv_usage or 0.0)
            p_score = matches[r] / blocks if blocks else 0.0
            score = cfg.queue_weight * q_score + cfg.kv_cache_weight * kv_score
            score += cfg.prefix_weight * p_score
            if score > best_score:
                best_score, best = score, [r]
            elif score == best_score:
                best.append(r)
        chosen = best[0] if len(best) == 1 else ctx.rng.choice(best)
        return ctx.decide(chosen, DecisionReason.BEST_SCORE)
