"""random: a uniformly random candidate (seeded through the router's rng)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.policies._base import RoutingContext
from prefixroute.core.types import Decision, DecisionReason


@dataclass(frozen=True, slots=True)
class RandomConfig:
    """No parameters."""


@dataclass(slots=True)
class RandomPick:
    name: ClassVar[str] = "random"
    config: RandomConfig = field(default_factory=RandomConfig)

    def decide(self, ctx: RoutingContext) -> Decision:
        return ctx.decide(ctx.rng.choice(ctx.candidates), DecisionReason.RANDOM)
