"""kv_cost: NVIDIA Dynamo's KV router cost.

Source: ai-dynamo/dynamo, ``lib/llm/src/kv_router/scheduler.rs``. Lower is better:

    prefill_blocks(w) = (active prefill tokens on w + uncached tokens of this request) / block
    decode_blocks(w)  = active KV blocks on w + this request's blocks
    logit(w)          = overlap_weight * prefill_blocks(w) + decode_blocks(w)

At temperature 0 the minimum wins, ties go to the smaller cached tree, then at random; above 0
the choice is a softmax sample over the negated, range-normalised logits. Dynamo counts only the
request's blocks not already active on the worker as new decode blocks; we count all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.errors import ConfigError
from prefixroute.core.policies._base import RoutingContext
from prefixroute.core.policies._params import ranged
from prefixroute.core.types import Decision, DecisionReason, ReplicaId


@dataclass(frozen=True, slots=True)
class KVCostConfig:
    overlap_weight: float = ranged(1.0, 0.0)  # Dynamo's overlap_score_weight
    temperature: float = 0.0  # 0 = deterministic argmin
    block_size: int = 16  # tokens per KV block in the cost, tokens

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.temperature < 0:
            raise ConfigError("block_size must be >= 1 and temperature >= 0")


@dataclass(slots=True)
class KVCost:
    name: ClassVar[str] = "kv_cost"
    config: KVCostConfig = field(default_factory=KVCostConfig)

    def logit(self, ctx: RoutingContext, r: ReplicaId) -> float:
        cfg = self.config
        load = ctx.load(r)
        prompt = ctx.request.prompt_tokens
        prefill = (load.queued_prefill_tokens + prompt - ctx.cached_tokens(r)) / cfg.block_size
        decode = load.active_blocks + -(-prompt // cfg.block_size)
        return cfg.overlap_weight * prefill + decode

    def decide(self, ctx: RoutingContext) -> Decision:
        logits = {r: self.logit(ctx, r) for r in ctx.candidates}
        if self.config.temperature > 0:
            chosen = self._sample(ctx, logits)
        else:
            low = min(logits.values())
            best = [r for r in ctx.candidates if logits[r] == low]
            if len(best) > 1:
                smallest = min(ctx.index.blocks_of(r) for r in best)
                best = [r for r in best if ctx.index.blocks_of(r) == smallest]
            chosen = best[0] if len(best) == 1 else ctx.rng.choice(best)
        return ctx.decide(chosen, DecisionReason.LOWEST_COST)

    def _sample(self, ctx: RoutingContext, logits: dict[ReplicaId, float]) -> ReplicaId:
        hi, lo = max(logits.values()), min(logits.values())
        span = (hi - lo) or 1.0
        weights = [math.exp(-(logits[r] - lo) / span / self.config.temperature) for r in logits]
        return ctx.rng.choices(list(logits), weights)[0]
