"""least_loaded: the candidate with the fewest in-flight requests (the article's fallback)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from prefixroute.core.policies._base import RoutingContext, least_loaded_of
from prefixroute.core.types import Decision, DecisionReason


@dataclass(frozen=True, slots=True)
class LeastLoadedConfig:
    """No parameters: ties on in-flight count break on queued prefill tokens, then at random."""


@dataclass(slots=True)
class LeastLoaded:
    name: ClassVar[str] = "least_loaded"
    config: LeastLoadedConfig = field(default_factory=LeastLoadedConfig)

    def decide(self, ctx: RoutingContext) -> Decision:
        return ctx.decide(least_loaded_of(ctx, ctx.candidates), DecisionReason.LEAST_LOADED)
