"""power_of_two: sample two candidates at random and take the less loaded (Mitzenmacher)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.policies._base import RoutingContext
from prefixroute.core.types import Decision, DecisionReason, ReplicaId


def power_of_two_choice(ctx: RoutingContext) -> ReplicaId:
    """Two distinct random candidates; fewer in-flight requests wins, ties keep the first."""
    if len(ctx.candidates) == 1:
        return ctx.candidates[0]
    a, b = ctx.rng.sample(list(ctx.candidates), 2)
    return b if ctx.load(b).in_flight < ctx.load(a).in_flight else a


@dataclass(frozen=True, slots=True)
class PowerOfTwoConfig:
    """No parameters."""


@dataclass(slots=True)
class PowerOfTwo:
    name: ClassVar[str] = "power_of_two"
    config: PowerOfTwoConfig = field(default_factory=PowerOfTwoConfig)

    def decide(self, ctx: RoutingContext) -> Decision:
        return ctx.decide(power_of_two_choice(ctx), DecisionReason.POWER_OF_TWO)
