"""A cold replica starts with its fleet's kind of step, not only its estimates.

From core/fleet_speed.py's docstring: a cold replica predicts with the estimates of the fleet's
median warmed-up replica *and its kind of step* (core/batch_mixing.py), which those estimates
were fitted with, so a fleet of engines whose prefill runs alone starts its fresh replicas as
such. From core/batch_mixing.py: the kind is a prior like the estimates; once warmed up, the
replica's own first tokens decide it.
"""

from __future__ import annotations

import pytest

from prefixroute.core import LoadTracker, ReplicaId, SpeedConfig

from .test_batch_mixing import feed
from .test_fleet_prior import learned_requests

COLD = ReplicaId("cold")


def warm_fleet(mixed: bool) -> LoadTracker:
    """Three replicas (the middle one "mid") that each learned their kind from 300 requests,
    and a cold one."""
    tracker = LoadTracker(speed=SpeedConfig())
    for seed, name in enumerate(("a", "mid", "c")):
        speed = tracker.get(ReplicaId(name)).speed
        feed(speed, mixed, 300, seed)
        assert speed.carries_decodes is mixed  # (what test_batch_mixing checks)
    tracker.add_replica(COLD)
    return tracker


@pytest.mark.parametrize("mixed", [True, False])
def test_a_cold_replica_takes_the_fleet_s_kind_with_its_estimates(mixed: bool) -> None:
    tracker = warm_fleet(mixed)
    cold = tracker[COLD].speed
    assert cold.carries_decodes  # before the fleet is taken: vLLM's steps, the default
    learned_requests(tracker, 8)
    assert cold.snapshot()["estimates_from"] == "fleet"
    assert cold.carries_decodes is mixed
    assert cold.snapshot()["prefill_steps"] == ("with_decodes" if mixed else "alone")
    # A first token of two chunks while the others decode waits for the steps of that kind.
    assert cold.steps(4096, True) == (2.5 if mixed else 0.5)
    tracker.add_replica(ReplicaId("late"))  # one added later starts the same way
    assert tracker[ReplicaId("late")].speed.carries_decodes is mixed


def test_what_the_cold_replica_saw_is_taken_again_with_the_fleet_s_steps() -> None:
    tracker = warm_fleet(False)
    cold = tracker[COLD].speed
    # One first token, two chunks of its own, sent while the replica decoded: vLLM's steps.
    obs = cold.observe_first_token(0.0, 0.0, True, 4096.0, 0.3)
    assert obs is not None and obs.x[1] == 2.5
    learned_requests(tracker, 8)
    assert not cold.carries_decodes
    assert obs.x[1] == 0.5  # the step under way only, as the fleet's estimates assume


def test_the_fleet_s_kind_is_a_prior_the_replica_s_own_first_tokens_overrule() -> None:
    tracker = warm_fleet(False)
    learned_requests(tracker, 8)
    cold = tracker[COLD].speed
    assert not cold.carries_decodes
    feed(cold, True, 300, seed=7)  # it is a vLLM-like engine in an SGLang-like fleet
    assert cold.snapshot()["estimates_from"] == "learned"
    assert cold.carries_decodes
    assert cold.prefill_tokens_per_s == pytest.approx(20_000.0, rel=0.15)


def test_a_replica_told_its_own_speed_keeps_its_own_kind() -> None:
    from prefixroute.core.speed_config import SpeedPrior

    tracker = warm_fleet(False)
    told = ReplicaId("told")
    tracker.add_replica(told, SpeedPrior.from_mapping({"prefill_tokens_per_s": 8_000.0}))
    learned_requests(tracker, 8)
    assert tracker[COLD].speed.carries_decodes is False
    assert tracker[told].speed.carries_decodes  # not cold: the fleet is not its prior
