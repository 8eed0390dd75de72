"""A cold replica's speed: the fleet's learned estimates, not the configured constants, and a
first token far off its prediction teaches at once (core/load.py's and core/speed.py's module
docstrings).

Written from those docstrings: a replica not warmed up predicts with the estimates of the
fleet's median warmed-up replica (ranked by one full step of prefill), taken again every
``max(REFIT_EVERY, replicas)`` learned requests while a replica is cold; a replica added later
starts from the last estimates taken; ``fleet_prior=False`` keeps the constants; a warmed-up
replica keeps its own fit.
"""

from __future__ import annotations

import random

import pytest

from prefixroute.core import LoadTracker, ReplicaId, ReplicaSpeed, SpeedConfig
from prefixroute.core.types import Decision, DecisionReason, RequestView

from .test_speed import feed

PRIOR = SpeedConfig()  # 10,000 tokens/s, 15 ms steps
RATES = {"slow": 5_000.0, "mid": 20_000.0, "fast": 40_000.0}  # three warmed-up replicas
COLD = ReplicaId("cold")


def send(tracker: LoadTracker, rid: str, replica: str, prompt: int, now: float) -> None:
    view = RequestView(rid, (), 16, prompt, prompt, 10)
    decision = Decision(ReplicaId(replica), DecisionReason.LEAST_LOADED, 0)
    tracker.dispatch(view, decision, now)


def warm_fleet(config: SpeedConfig = PRIOR) -> LoadTracker:
    """Three replicas fed 100 requests each at their true rate (15 ms steps), and a cold one."""
    tracker = LoadTracker(speed=config)
    for i, (name, rate) in enumerate(RATES.items()):
        feed(tracker.get(ReplicaId(name)).speed, random.Random(i), rate, 0.015, 100)
    tracker.add_replica(COLD)
    return tracker


def learned_requests(tracker: LoadTracker, count: int, replica: str = "mid") -> None:
    """``count`` requests through the tracker on a warmed-up replica, each one learned from."""
    for i in range(count):
        t = 10.0 * i
        send(tracker, f"q{replica}{i}", replica, 1000, t)
        tracker.first_token(f"q{replica}{i}", t + 0.05)
        tracker.complete(f"q{replica}{i}", t + 0.5, output_tokens=10)


def median_replica(tracker: LoadTracker) -> ReplicaSpeed:
    speeds = [tracker[ReplicaId(name)].speed for name in RATES]
    return sorted(speeds, key=lambda s: s.ttft_s(PRIOR.step_tokens, 1.0))[1]


def test_a_cold_replica_predicts_with_the_fleet_s_median_replica() -> None:
    tracker = warm_fleet()
    cold = tracker[COLD].speed
    assert cold.snapshot()["estimates_from"] == "prior"
    assert tracker.fleet_estimates() is None
    learned_requests(tracker, 8)  # max(REFIT_EVERY = 8, 4 replicas) learned requests
    mid = median_replica(tracker)
    assert mid is tracker[ReplicaId("mid")].speed  # the 20,000 tokens/s one
    assert cold.prefill_tokens_per_s == mid.prefill_tokens_per_s
    assert cold.decode_step_s == mid.decode_step_s
    assert cold.prefill_tokens_per_s == pytest.approx(20_000.0, rel=0.15)
    assert tracker.fleet_estimates() == mid.estimates()
    assert cold.snapshot()["estimates_from"] == "fleet"
    assert mid.snapshot()["estimates_from"] == "learned"


def test_the_fleet_is_taken_after_max_refit_every_or_replicas_learned_requests() -> None:
    tracker = warm_fleet()
    learned_requests(tracker, 7)
    assert tracker[COLD].speed.prefill_tokens_per_s == PRIOR.prefill_tokens_per_s
    learned_requests(tracker, 1)
    assert tracker[COLD].speed.prefill_tokens_per_s != PRIOR.prefill_tokens_per_s
    # Ten replicas: every ten learned requests, not every eight.
    big = warm_fleet()
    for i in range(6):
        big.add_replica(ReplicaId(f"more{i}"))
    learned_requests(big, 9)
    assert big[COLD].speed.prefill_tokens_per_s == PRIOR.prefill_tokens_per_s
    learned_requests(big, 1)
    assert big[COLD].speed.prefill_tokens_per_s != PRIOR.prefill_tokens_per_s


def test_a_replica_added_later_starts_from_the_last_fleet_estimates() -> None:
    tracker = warm_fleet()
    learned_requests(tracker, 8)
    fleet = tracker.fleet_estimates()
    assert fleet is not None
    tracker.add_replica(ReplicaId("late"))
    late = tracker[ReplicaId("late")].speed
    assert late.estimates()[:2] == fleet[:2]
    assert late.snapshot()["estimates_from"] == "fleet"


def test_without_fleet_prior_a_cold_replica_keeps_the_constants() -> None:
    tracker = warm_fleet(SpeedConfig(fleet_prior=False))
    learned_requests(tracker, 16)
    cold = tracker[COLD].speed
    assert (cold.prefill_tokens_per_s, cold.decode_step_s) == (10_000.0, 0.015)
    assert cold.snapshot()["estimates_from"] == "prior"
    assert tracker.fleet_estimates() is None


def test_a_removed_cold_replica_is_no_reason_to_take_the_fleet() -> None:
    tracker = warm_fleet()
    tracker.remove_replica(COLD)
    learned_requests(tracker, 16)
    assert tracker.fleet_estimates() is None


def test_a_cold_replica_warms_up_on_its_own_observations() -> None:
    tracker = warm_fleet()
    learned_requests(tracker, 8)
    cold = tracker[COLD].speed
    feed(cold, random.Random(9), 2_500.0, 0.015, 100)  # it is slower than the whole fleet
    assert cold.snapshot()["estimates_from"] == "learned"
    assert cold.prefill_tokens_per_s == pytest.approx(2_500.0, rel=0.15)
    mine = cold.estimates()
    cold.start_from((40_000.0, 0.01, 0.0, 0.0, 0.0))  # warmed up: the fleet no longer applies
    assert cold.estimates() == mine
    learned_requests(tracker, 16)  # and it is no longer cold
    assert cold.estimates() == mine


def test_start_from_stays_within_the_bounds_and_learns_no_overhead_it_would_not() -> None:
    speed = ReplicaSpeed(PRIOR)
    speed.start_from((1e9, 10.0, 0.05, 0.02, 1.0))
    assert speed.prefill_tokens_per_s == PRIOR.prefill_tokens_per_s * PRIOR.bound
    assert speed.decode_step_s == PRIOR.decode_step_s * PRIOR.bound
    assert speed.first_token_overhead_s == 0.0  # learn_overhead is off: the prior's 0
    assert speed.engine_overhead_s == 0.02
    assert speed.attention_s == PRIOR.bound / PRIOR.prefill_tokens_per_s  # its bound
    speed.start_from((1.0, 0.0, 0.05, 99.0, -1.0))
    assert speed.prefill_tokens_per_s == PRIOR.prefill_tokens_per_s / PRIOR.bound
    assert speed.decode_step_s == PRIOR.decode_step_s / PRIOR.bound
    assert speed.engine_overhead_s == PRIOR.bound * PRIOR.overhead_scale_s
    assert speed.attention_s == 0.0  # never below 0
    learning = ReplicaSpeed(SpeedConfig(learn_overhead=True))
    learning.start_from((10_000.0, 0.015, 0.05, 0.0, 2e-5))
    assert learning.first_token_overhead_s == 0.05
    assert learning.attention_s == 2e-5  # learned on its peers, within its bounds
    linear = ReplicaSpeed(SpeedConfig(learn_attention=False))
    linear.start_from((10_000.0, 0.015, 0.0, 0.0, 2e-5))
    assert linear.attention_s == 0.0  # it would not learn one: the prior's 0
    fixed = ReplicaSpeed(SpeedConfig(fleet_prior=False))
    fixed.start_from((20_000.0, 0.01, 0.0, 0.0, 0.0))
    assert fixed.prefill_tokens_per_s == 10_000.0


# --- a first token far off its prediction, while warming up ----------------------------------
@pytest.mark.parametrize(
    ("sent", "ttft_s", "at_once"),
    [
        (7.0, 0.5, True),
        (7.0, 0.21, True),
        (7.0, 0.19, False),
        (7.0, 0.1, False),
        (7.0, 0.06, False),
        (7.0, 0.04, True),
        (0.0, 0.2, False),  # exactly 2x: not over
        (0.0, 0.05, False),  # exactly half
    ],
)
def test_a_warming_replica_learns_from_a_first_token_over_2x_off_at_once(
    sent: float, ttft_s: float, at_once: bool
) -> None:
    # 1,000 uncached tokens at the prior's 10,000 tokens/s: predicted 0.1 s.
    tracker = LoadTracker()
    send(tracker, "a", "r0", 1000, sent)
    tracker.first_token("a", sent + ttft_s)
    speed = tracker[ReplicaId("r0")].speed
    assert speed.prefill_observations == (1 if at_once else 0)
    tracker.complete("a", sent + 1.0, output_tokens=10)
    assert speed.prefill_observations == 1  # learned once, whenever


def test_a_decoding_replica_s_prediction_counts_its_steps() -> None:
    # 1,000 tokens while decoding: 0.1 s + 1.5 steps of 0.015 s = 0.1225 s predicted; 0.24 s
    # is under 2x that (without the steps it would be over 2x 0.1 s).
    tracker = LoadTracker()
    send(tracker, "busy", "r0", 100, 0.0)
    tracker.first_token("busy", 0.01)  # r0 now decodes it
    send(tracker, "a", "r0", 1000, 1.0)
    tracker.first_token("a", 1.24)
    assert tracker[ReplicaId("r0")].speed.prefill_observations == 0


def test_the_reported_count_corrects_what_the_first_token_taught() -> None:
    # Predicted 900 of 1,000 tokens cached: 0.01 s; 0.1 s is 10x off, so it teaches at once,
    # as 100 tokens. The replica then reports 500 uncached: the model ends where one that
    # predicted 500 right (and learned at the end) does, within the speed model's 15%, and
    # far from where the 100 tokens put it.
    def rate(predicted_cached: int, reported_cached: int | None) -> float:
        tracker = LoadTracker(speed=SpeedConfig(min_observations=1))
        view = RequestView("a", (), 16, 1000, 1000, 10)
        why = DecisionReason.PREFIX_MATCH
        tracker.dispatch(view, Decision(ReplicaId("r0"), why, predicted_cached), 5.0)
        tracker.first_token("a", 5.1)
        if reported_cached is not None:
            tracker.observe_usage("a", prompt_tokens=1000, cached_tokens=reported_cached)
        tracker.complete("a", 6.0)
        return tracker[ReplicaId("r0")].speed.prefill_tokens_per_s

    right = rate(500, 500)  # 0.1 s for a predicted 0.05: not misjudged, learned at the end
    uncorrected = rate(900, None)
    assert uncorrected < 0.5 * right
    assert rate(900, 500) == pytest.approx(right, rel=0.15)
    assert rate(900, 0) > rate(900, 500)  # 1,000 tokens in the same time: faster


def test_one_warmed_up_replica_is_the_fleet() -> None:
    tracker = LoadTracker()
    feed(tracker.get(ReplicaId("only")).speed, random.Random(3), 30_000.0, 0.015, 100)
    tracker.add_replica(COLD)
    learned_requests(tracker, 8, "only")
    assert tracker.fleet_estimates() == tracker[ReplicaId("only")].speed.estimates()


def test_a_warmed_up_replica_waits_for_the_end_however_far_off() -> None:
    tracker = LoadTracker(speed=SpeedConfig(min_observations=1))
    speed = tracker.get(ReplicaId("r0")).speed
    speed.observe_prefill(1000.0, 0.0, 0.1)
    send(tracker, "a", "r0", 1000, 0.0)
    tracker.first_token("a", 2.0)  # 20x the prediction
    assert speed.prefill_observations == 1
    tracker.complete("a", 3.0, output_tokens=10)
    assert speed.prefill_observations == 2


def test_an_unmeasured_first_token_teaches_nothing_early() -> None:
    tracker = LoadTracker()
    send(tracker, "a", "r0", 1000, 0.0)
    tracker.first_token("a", 0.5, measured=False)
    tracker.complete("a", 1.0, output_tokens=10)
    assert tracker[ReplicaId("r0")].speed.prefill_observations == 0
