"""least_loaded: the candidate with the fewest in-flight requests (the article's fallback).

No parameters: ties on in-flight count break on queued prefill tokens, then at random.
"""

from __future__ import annotations

from prefixroute.core.policies._base import NoParams, PickPolicy, RoutingContext, least_loaded_of
from prefixroute.core.types import DecisionReason, ReplicaId

LeastLoadedConfig = NoParams


class LeastLoaded(PickPolicy):
    name = "least_loaded"
    reason = DecisionReason.LEAST_LOADED

    def pick(self, ctx: RoutingContext) -> ReplicaId:
        return least_loaded_of(ctx, ctx.candidates)
