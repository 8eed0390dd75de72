"""random: a uniformly random candidate (seeded through the router's rng). No parameters."""

from __future__ import annotations

from prefixroute.core.policies._base import NoParams, PickPolicy, RoutingContext
from prefixroute.core.types import DecisionReason, ReplicaId

RandomConfig = NoParams


class RandomPick(PickPolicy):
    name = "random"
    reason = DecisionReason.RANDOM

    def pick(self, ctx: RoutingContext) -> ReplicaId:
        return ctx.rng.choice(ctx.candidates)
