"""round_robin: a fixed cyclic order over the candidates, blind to load and cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.policies._base import RoutingContext
from prefixroute.core.types import Decision, DecisionReason


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    """No parameters: every stateless load balancer's default."""


@dataclass(slots=True)
class RoundRobin:
    name: ClassVar[str] = "round_robin"
    config: RoundRobinConfig = field(default_factory=RoundRobinConfig)
    _next: int = 0  # position of the next pick in the candidate order

    def decide(self, ctx: RoutingContext) -> Decision:
        replica = ctx.candidates[self._next % len(ctx.candidates)]
        self._next += 1
        return ctx.decide(replica, DecisionReason.ROUND_ROBIN)
