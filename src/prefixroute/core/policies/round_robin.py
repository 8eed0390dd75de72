"""round_robin: a fixed cyclic order over the candidates, blind to load and cache.

No parameters: every stateless load balancer's default.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixroute.core.policies._base import NoParams, PickPolicy, RoutingContext
from prefixroute.core.types import DecisionReason, ReplicaId

RoundRobinConfig = NoParams


@dataclass(slots=True)
class RoundRobin(PickPolicy):
    name = "round_robin"
    reason = DecisionReason.ROUND_ROBIN
    _next: int = 0  # position of the next pick in the candidate order

    def pick(self, ctx: RoutingContext) -> ReplicaId:
        replica = ctx.candidates[self._next % len(ctx.candidates)]
        self._next += 1
        return replica
