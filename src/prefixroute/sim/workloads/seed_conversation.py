"""seed-conversation: the article's worked example 1, one 5-turn conversation, token-exact.

Turn 1 is system 200 + question 25 + retrieved 175 = 400 tokens; each later turn is the previous
prompt + the answer + a new question + new retrieved context, giving 400, 700, 1000, 1400 and 1700
tokens. Turn k's output is the answer that reappears in turn k+1's prompt (the last turn's is 100).
Block size 1 so the simulator can reproduce the article's token-exact reuse (3,500 of 5,200).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixroute.core import ConfigError
from prefixroute.sim.workload import Session, Workload
from prefixroute.sim.workloads._build import TokenSource, prefix_turns
from prefixroute.sim.workloads._config import check_non_negative, check_positive, param
from prefixroute.sim.workloads._params import shared_param


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise ConfigError(f"{name} must list at least one token count, none negative")
    return values


@dataclass(frozen=True, slots=True)
class SeedConversationConfig:
    system_len: int = shared_param("system_prompt", 200)
    question_len: int = param(25, "user question per turn, tokens")
    retrieved: str = param("175,175,175,225,175", "retrieved context per turn, tokens (a list)")
    answers: str = param("100,100,150,100,100", "answer per turn = its output, tokens (a list)")
    think_s: float = param(1.0, "pause between an answer and the next question, seconds")
    block_size: int = shared_param("suggested_block_size", 1)

    def __post_init__(self) -> None:
        check_non_negative(self, "system_len", "question_len", "think_s")
        check_positive(self, "block_size")
        retrieved = _int_list(self.retrieved, "retrieved")
        answers = _int_list(self.answers, "answers")
        if len(retrieved) != len(answers):
            raise ConfigError(f"retrieved has {len(retrieved)} turns but answers {len(answers)}")
        if min(answers) < 1:
            raise ConfigError("every answer needs at least one token (it is the turn's output)")


def build(config: SeedConversationConfig, seed: int) -> Workload:
    ids = TokenSource(np.random.default_rng(seed))
    retrieved = _int_list(config.retrieved, "retrieved")
    answers = _int_list(config.answers, "answers")
    parts = [ids.fresh(config.system_len)]
    ends: list[int] = []
    length = config.system_len
    for k, context in enumerate(retrieved):
        if k:  # the previous answer joins the history before the new question
            parts.append(ids.fresh(answers[k - 1]))
            length += answers[k - 1]
        parts += [ids.fresh(config.question_len), ids.fresh(context)]
        length += config.question_len + context
        ends.append(length)
    turns = prefix_turns(np.concatenate(parts), ends, answers, [config.think_s] * len(ends))
    return Workload(
        name="seed-conversation",
        sessions=[Session(session_id="conv0", start_s=0.0, turns=turns)],
        block_size=config.block_size,
        description=f"the article's {len(turns)}-turn conversation, prompts "
        + ", ".join(str(e) for e in ends)
        + " tokens",
    )
