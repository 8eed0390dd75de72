"""power_of_two: sample two candidates at random and take the less loaded (Mitzenmacher).

No parameters.
"""

from __future__ import annotations

from prefixroute.core.policies._base import NoParams, PickPolicy, RoutingContext
from prefixroute.core.types import DecisionReason, ReplicaId

PowerOfTwoConfig = NoParams


def power_of_two_choice(ctx: RoutingContext) -> ReplicaId:
    """Two distinct random candidates; fewer in-flight requests wins, ties keep the first."""
    if len(ctx.candidates) == 1:
        return ctx.candidates[0]
    a, b = ctx.rng.sample(list(ctx.candidates), 2)
    return b if ctx.load(b).in_flight < ctx.load(a).in_flight else a


class PowerOfTwo(PickPolicy):
    name = "power_of_two"
    reason = DecisionReason.POWER_OF_TWO

    def pick(self, ctx: RoutingContext) -> ReplicaId:
        return power_of_two_choice(ctx)
