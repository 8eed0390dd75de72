"""no-sharing: unrelated prompts, the case where prefix-aware routing cannot gain anything.

Every prompt is fresh tokens (no two requests share even their first token), so a cache-aware
router must do no worse than a plain load balancer here (trade-off 3 of the article). Lengths are
uniform within ``spread`` of their means, like SGLang's random dataset with a range ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixroute.core import ConfigError
from prefixroute.sim.workload import Workload
from prefixroute.sim.workloads._build import TokenSource, poisson_workload, uniform_ints
from prefixroute.sim.workloads._config import check_positive, param
from prefixroute.sim.workloads._params import shared_param


@dataclass(frozen=True, slots=True)
class NoSharingConfig:
    requests: int = shared_param("one_turn_requests", 2000)
    rate: float = shared_param("poisson_rate", 27.0)
    prompt_len: int = param(1024, "mean prompt, tokens")
    output_len: int = param(128, "mean output, tokens")
    spread: float = param(0.5, "lengths are uniform in mean * (1 -/+ spread)")

    def __post_init__(self) -> None:
        check_positive(self, "requests", "rate", "prompt_len", "output_len")
        if not 0 <= self.spread < 1:
            raise ConfigError(f"spread must be in [0, 1), got {self.spread}")


def _lengths(rng: np.random.Generator, mean: int, spread: float, n: int) -> list[int]:
    low = max(1, round(mean * (1 - spread)))
    return uniform_ints(rng, low, max(low, round(mean * (1 + spread))), n)


def build(config: NoSharingConfig, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    ids = TokenSource(rng)
    n = config.requests
    prompts = _lengths(rng, config.prompt_len, config.spread, n)
    outputs = _lengths(rng, config.output_len, config.spread, n)
    requests = [(ids.fresh(prompts[i]), outputs[i], None) for i in range(n)]
    return poisson_workload(
        "no-sharing",
        rng,
        config.rate,
        requests,
        f"{n} unrelated prompts of ~{config.prompt_len} tokens, {config.rate:g} req/s",
    )
