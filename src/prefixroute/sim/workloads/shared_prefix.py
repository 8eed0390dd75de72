"""shared-prefix: SGLang's ``generated-shared-prefix`` benchmark (bench_serving.py).

``num_groups`` long system prompts, each followed by ``prompts_per_group`` different questions;
all requests are shuffled and sent as a Poisson process. Parameter names and defaults are
SGLang's ``--gsp-*`` flags (64 groups x 16 prompts, 2048-token system prompts, 128-token
questions, 256 output tokens). The 64 system prompts fill a whole replica's default KV cache
(8192 blocks of 16 = 131k tokens), so a router that scatters groups over every replica thrashes,
while one that keeps each group on one replica needs only a quarter of each cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixroute.sim.workload import TokenArray, Workload
from prefixroute.sim.workloads._build import TokenSource, frozen, poisson_workload
from prefixroute.sim.workloads._config import check_non_negative, check_positive, param
from prefixroute.sim.workloads._params import shared_param


@dataclass(frozen=True, slots=True)
class SharedPrefixConfig:
    num_groups: int = param(64, "distinct system prompts")
    prompts_per_group: int = param(16, "requests (questions) per system prompt")
    system_prompt_len: int = shared_param("system_prompt", 2048)
    question_len: int = param(128, "question after the system prompt, tokens")
    output_len: int = shared_param("tokens_per_request", 256)
    rate: float = shared_param("poisson_rate", 13.0)
    shuffle: bool = param(True, "send in random order (SGLang does); false: group by group")

    def __post_init__(self) -> None:
        check_positive(self, "num_groups", "prompts_per_group", "question_len")
        check_positive(self, "output_len", "rate")
        check_non_negative(self, "system_prompt_len")


def build(config: SharedPrefixConfig, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    ids = TokenSource(rng)
    prompts: list[tuple[int, TokenArray]] = []  # (group, prompt tokens)
    for g in range(config.num_groups):
        system = ids.fresh(config.system_prompt_len)
        for _ in range(config.prompts_per_group):
            prompts.append((g, frozen(np.concatenate([system, ids.fresh(config.question_len)]))))
    # SGLang shuffles the requests before sending; unshuffled, each group arrives back to back.
    order = rng.permutation(len(prompts)) if config.shuffle else np.arange(len(prompts))
    requests = [(prompts[j][1], config.output_len, f"group{prompts[j][0]}") for j in order]
    return poisson_workload(
        "shared-prefix",
        rng,
        config.rate,
        requests,
        f"{config.num_groups} groups x {config.prompts_per_group} prompts over "
        f"{config.system_prompt_len}-token system prompts, "
        f"{'shuffled' if config.shuffle else 'in order'}, {config.rate:g} req/s",
    )
