"""multi-turn: many users chatting, each turn re-sending the whole history.

Sessions start as a Poisson process; each has a shared system prompt, then alternating questions
and answers whose lengths are drawn uniformly from configurable ranges. Turn k's prompt is the
system prompt, every earlier question and answer, and question k; its output is answer k, which
reappears in turn k+1's prompt. Users think (exponential) between an answer and their next turn.
This is where routing a conversation back to the replica holding its history pays: a cache-blind
router with n replicas finds the history only about 1/n of the time.

Cluster events (a cold replica joining, one leaving) can be scheduled to test scale-up and
scale-down; the simulator reads them from ``Workload.cluster_events``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixroute.sim.workload import ClusterEvent, Session, Workload
from prefixroute.sim.workloads._build import (
    TokenSource,
    poisson_starts,
    prefix_turns,
    uniform_ints,
)
from prefixroute.sim.workloads._config import (
    check_non_negative,
    check_positive,
    check_range,
    param,
)
from prefixroute.sim.workloads._params import shared_param


@dataclass(frozen=True, slots=True)
class MultiTurnConfig:
    sessions: int = param(500, "conversations")
    rate: float = param(4.3, "conversation starts per second (Poisson)")
    system_len: int = param(512, "system prompt shared by every conversation, tokens")
    turns_min: int = param(2, "fewest turns in a conversation")
    turns_max: int = param(8, "most turns in a conversation (uniform in between)")
    question_min: int = param(20, "shortest user message, tokens")
    question_max: int = param(200, "longest user message, tokens (uniform in between)")
    answer_min: int = param(40, "shortest answer = turn output, tokens")
    answer_max: int = param(300, "longest answer, tokens (uniform in between)")
    think_mean_s: float = shared_param("think_pause_mean", 10.0)
    add_replica_at_s: float = param(-1.0, "when a cold replica joins, seconds (< 0: never)")
    add_replica: str = param("r4", "id of the replica that joins")
    remove_replica_at_s: float = param(-1.0, "when a replica leaves, seconds (< 0: never)")
    remove_replica: str = param("r0", "id of the replica that leaves")

    def __post_init__(self) -> None:
        check_positive(self, "sessions", "rate", "turns_min", "question_min", "answer_min")
        check_non_negative(self, "system_len", "think_mean_s")
        for low, high in ("turns_min", "turns_max"), ("question_min", "question_max"):
            check_range(self, low, high)
        check_range(self, "answer_min", "answer_max")


def cluster_events(config: MultiTurnConfig) -> list[ClusterEvent]:
    """The scheduled joins and leaves, in time order."""
    events = []
    if config.add_replica_at_s >= 0:
        events.append(ClusterEvent(config.add_replica_at_s, "add", config.add_replica))
    if config.remove_replica_at_s >= 0:
        events.append(ClusterEvent(config.remove_replica_at_s, "remove", config.remove_replica))
    return sorted(events, key=lambda e: e.at_s)


def build(config: MultiTurnConfig, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    ids = TokenSource(rng)
    system = ids.fresh(config.system_len)
    starts = poisson_starts(rng, config.sessions, config.rate)
    sessions = []
    for i, start in enumerate(starts):
        n = int(rng.integers(config.turns_min, config.turns_max + 1))
        questions = uniform_ints(rng, config.question_min, config.question_max, n)
        answers = uniform_ints(rng, config.answer_min, config.answer_max, n)
        thinks = rng.exponential(config.think_mean_s, n) if config.think_mean_s else np.zeros(n)
        # One array holds system, q1, a1, ..., qn; turn k's prompt ends just after question k.
        # The last answer is never part of a prompt, so it gets no tokens.
        parts = [system]
        ends = []
        length = config.system_len
        for k in range(n):
            if k:
                parts.append(ids.fresh(answers[k - 1]))
                length += answers[k - 1]
            parts.append(ids.fresh(questions[k]))
            length += questions[k]
            ends.append(length)
        turns = prefix_turns(np.concatenate(parts), ends, answers, [float(t) for t in thinks])
        sessions.append(Session(session_id=f"conv{i}", start_s=float(start), turns=turns))
    return Workload(
        name="multi-turn",
        sessions=sessions,
        block_size=16,
        description=f"{config.sessions} conversations of {config.turns_min}-{config.turns_max} "
        f"turns at {config.rate:g}/s over a {config.system_len}-token system prompt",
        cluster_events=cluster_events(config),
    )
