"""seed-shared-prompt: the article's worked example 2, 50 users behind one system prompt.

Every user sends one request: the common 200-token system prompt (one array, identical in every
request) followed by a question of their own. Arrivals are staggered by ``interval_s`` so that a
load-balancing policy over 5 replicas spreads them 10 per replica; the first request on each
replica warms it and each of the other 9 saves the 200 system tokens (9,000 tokens in all).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixroute.core import ConfigError
from prefixroute.sim.workload import Workload
from prefixroute.sim.workloads._build import TokenSource, one_turn_sessions
from prefixroute.sim.workloads._config import check_non_negative, check_positive, param
from prefixroute.sim.workloads._params import shared_param


@dataclass(frozen=True, slots=True)
class SeedSharedPromptConfig:
    users: int = param(50, "users, one request each")
    system_len: int = param(200, "shared system prompt, tokens")
    question_len: int = param(50, "each user's own question, tokens")
    output_len: int = shared_param("tokens_per_request", 50)
    interval_s: float = param(0.01, "gap between consecutive arrivals, seconds")
    block_size: int = shared_param("suggested_block_size", 1)

    def __post_init__(self) -> None:
        check_positive(self, "users", "output_len", "block_size")
        check_non_negative(self, "system_len", "question_len", "interval_s")
        if self.system_len + self.question_len < 1:
            raise ConfigError("a prompt needs at least one token")


def build(config: SeedSharedPromptConfig, seed: int) -> Workload:
    ids = TokenSource(np.random.default_rng(seed))
    system = ids.fresh(config.system_len)
    requests = (
        (
            u * config.interval_s,
            np.concatenate([system, ids.fresh(config.question_len)]),
            config.output_len,
            None,
        )
        for u in range(config.users)
    )
    sessions = one_turn_sessions(requests, prefix="user")
    return Workload(
        name="seed-shared-prompt",
        sessions=sessions,
        block_size=config.block_size,
        description=f"the article's {config.users} users sharing a {config.system_len}-token "
        "system prompt, one request each",
    )
