"""hot-prefix: a few system prompts with Zipf popularity at high load, where affinity hurts.

Each request is one of ``prompts`` system prompts, chosen with probability proportional to
``rank ** -zipf_s``, plus a unique question. The prompts are few and short enough that every
replica can cache all of them, so a cache-blind balancer already gets almost every system-prompt
hit; the load that remains is the questions, which default to 75% of 4 replicas' prefill
capacity (10,000 tokens/s each). With the defaults the most popular prompt draws 43% of requests,
so a router that pins each prompt to one replica overloads that replica (about 170% of its
capacity) unless it lets load balancing override affinity: trade-off 1 of the article.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from prefixroute.sim.workload import Workload
from prefixroute.sim.workloads._build import TokenSource, poisson_workload
from prefixroute.sim.workloads._config import check_non_negative, check_positive, param
from prefixroute.sim.workloads._params import shared_param


@dataclass(frozen=True, slots=True)
class HotPrefixConfig:
    requests: int = shared_param("one_turn_requests", 3000)
    rate: float = shared_param("poisson_rate", 117.0)
    prompts: int = param(8, "distinct system prompts")
    zipf_s: float = param(1.2, "Zipf exponent of prompt popularity (0: uniform)")
    system_len: int = shared_param("system_prompt", 1024)
    question_len: int = param(256, "unique question after it, tokens")
    output_len: int = shared_param("tokens_per_request", 64)

    def __post_init__(self) -> None:
        check_positive(self, "requests", "rate", "prompts", "question_len", "output_len")
        check_non_negative(self, "zipf_s", "system_len")


def popularity(prompts: int, zipf_s: float) -> npt.NDArray[np.float64]:
    """Probability of each prompt rank: ``rank ** -zipf_s``, normalised."""
    weights = np.arange(1, prompts + 1, dtype=np.float64) ** -zipf_s
    share: npt.NDArray[np.float64] = weights / weights.sum()
    return share


def build(config: HotPrefixConfig, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    ids = TokenSource(rng)
    systems = [ids.fresh(config.system_len) for _ in range(config.prompts)]
    share = popularity(config.prompts, config.zipf_s)
    choice = rng.choice(config.prompts, size=config.requests, p=share)
    prompts = (np.concatenate([systems[p], ids.fresh(config.question_len)]) for p in choice)
    requests = [
        (prompt, config.output_len, f"prompt{p}") for p, prompt in zip(choice, prompts, strict=True)
    ]
    return poisson_workload(
        "hot-prefix",
        rng,
        config.rate,
        requests,
        f"{config.prompts} system prompts, Zipf s={config.zipf_s:g} "
        f"(top prompt {share[0]:.0%} of requests), {config.rate:g} req/s",
    )
