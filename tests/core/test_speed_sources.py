"""The speed model's other sources and its report card (issue 11, prefixroute.core.speed).

* A fixed overhead on every first token (HTTP, templating, scheduling), learned with
  ``learn_overhead``: without the term such TTFTs drag the rate far off and the predictions of
  short and long requests with it.
* An engine's own prefill times, per scrape interval (``observe_engine_prefill`` and
  ``Router.observe_engine_prefill``): they teach the rate with no first token measured, and
  are left out while a full window of streamed first tokens teaches it (core/speed_fit.py).
* The TTFT predictions judged past the warm-up (``ttft_ratios``, ``snapshot``).
"""

from __future__ import annotations

import random
import statistics

import pytest

from prefixroute.core import ConfigError, ReplicaId, ReplicaSpeed, SpeedConfig, make_policy
from prefixroute.core.router import Router

RATE, OVERHEAD = 5_000.0, 0.025  # the true replica: tokens/s, seconds per first token


def idle_requests(speed: ReplicaSpeed, rng: random.Random, n: int) -> None:
    """``n`` requests of 20-3,000 tokens (log-uniform: short ones are common, as turns of a
    conversation are) on an idle replica (no decode steps), each paying the fixed overhead,
    with a little jitter."""
    for _ in range(n):
        tokens = 20 * 150 ** rng.random()
        ttft = OVERHEAD + tokens / RATE + rng.uniform(0.0, 0.002)
        speed.observe_prefill(tokens, 0.0, ttft)


def p50_error(speed: ReplicaSpeed) -> float:
    return statistics.median(abs(r - 1) for r in speed.ttft_ratios())


def test_a_learned_overhead_predicts_short_and_long_first_tokens() -> None:
    learned = ReplicaSpeed(SpeedConfig(learn_overhead=True))
    idle_requests(learned, random.Random(0), 200)
    assert learned.prefill_tokens_per_s == pytest.approx(RATE, rel=0.1)
    assert learned.first_token_overhead_s == pytest.approx(OVERHEAD, rel=0.25)
    assert p50_error(learned) < 0.1
    # The same requests with the overhead held at its prior (0): the rate has to carry it.
    fixed = ReplicaSpeed(SpeedConfig())
    idle_requests(fixed, random.Random(0), 200)
    assert fixed.first_token_overhead_s == 0.0
    assert p50_error(fixed) > 3 * p50_error(learned)


def test_predictions_are_judged_only_past_the_warm_up() -> None:
    """The warm-up is the prior phase: the first ``min_observations`` observations."""
    speed = ReplicaSpeed(SpeedConfig(min_observations=8))
    for i in range(8):
        assert not speed.warmed_up
        speed.observe_prefill(1000.0, 0.0, 0.2)  # predicted 0.1 s at the prior rate
        assert speed.ttft_predictions == 0, i
    assert speed.warmed_up and speed.snapshot()["ttft_error_p50"] is None
    # Learned from those eight: 1,000 tokens in 0.2 s. Predicted before it teaches the model.
    predicted = speed.ttft_s(1000.0, 0.0)
    speed.observe_prefill(1000.0, 0.0, 0.4)
    assert speed.ttft_ratios() == [pytest.approx(predicted / 0.4)]
    snap = speed.snapshot()
    assert snap["ttft_predictions"] == 1
    assert snap["ttft_error_p50"] == pytest.approx(abs(predicted / 0.4 - 1))
    assert snap["ttft_ratio_p50"] == pytest.approx(predicted / 0.4)


def test_engine_prefill_times_teach_the_rate_without_a_first_token() -> None:
    """Scrape intervals: ``requests`` requests computing ``tokens`` in ``seconds`` of prefill,
    each also paying the engine's own 4 ms per request. Some intervals see short prompts,
    others long ones (a fixed mix would leave the rate and that 4 ms indistinguishable)."""
    speed = ReplicaSpeed(SpeedConfig())
    rng = random.Random(1)
    for i in range(40):
        requests = rng.randint(1, 12)
        longest = 200 if i % 2 else 3000
        tokens = sum(rng.uniform(20, longest) for _ in range(requests))
        speed.observe_engine_prefill(tokens, requests, tokens / RATE + requests * 0.004)
    assert speed.prefill_observations == 0 and speed.engine_observations == 40
    assert speed.prefill_tokens_per_s == pytest.approx(RATE, rel=0.1)
    assert 0.002 < speed.engine_overhead_s < 0.008
    assert speed.first_token_overhead_s == 0.0  # no first token seen: nothing to say of it


def test_nonsense_engine_intervals_are_ignored() -> None:
    speed = ReplicaSpeed(SpeedConfig(min_observations=1))
    for tokens, requests, seconds in (
        (1000.0, 0, 1.0), (-5.0, 2, 1.0), (1000.0, 2, 0.0), (1000.0, 2, float("nan")),
    ):  # fmt: skip
        speed.observe_engine_prefill(tokens, requests, seconds)
    assert speed.engine_observations == 0
    assert speed.prefill_tokens_per_s == 10_000.0
    ReplicaSpeed(SpeedConfig(learn=False)).observe_engine_prefill(1000.0, 1, 1.0)


def test_the_router_passes_engine_prefill_times_to_the_replica_s_speed() -> None:
    router = Router(make_policy("predicted_ttft"))
    r0, r1 = ReplicaId("r0"), ReplicaId("r1")
    router.add_replica(r0)
    router.add_replica(r1)
    for i in range(20):  # 10 requests of 2,000 or of 100 tokens, 4 ms each besides
        tokens = 20_000.0 if i % 2 else 1_000.0
        router.observe_engine_prefill(r0, tokens=tokens, requests=10, seconds=tokens / RATE + 0.04)
    router.observe_engine_prefill(ReplicaId("gone"), tokens=1.0, requests=1, seconds=1.0)
    assert router.replica_load(r0).speed.prefill_tokens_per_s == pytest.approx(RATE, rel=0.2)
    assert router.replica_load(r1).speed.engine_observations == 0
    assert not router.has_replica(ReplicaId("gone"))


def shared_step_intervals(speed: ReplicaSpeed, rng: random.Random, n: int) -> None:
    """``n`` scrape intervals of a backlogged engine whose prompts shared every step: each
    prompt's prefill time holds its neighbours' chunks too, 3x its own tokens' time."""
    for _ in range(n):
        requests = rng.randint(2, 8)
        tokens = sum(rng.uniform(200, 2000) for _ in range(requests))
        speed.observe_engine_prefill(tokens, requests, 3 * tokens / RATE)


def first_tokens(speed: ReplicaSpeed, rng: random.Random, n: int) -> None:
    """``n`` streamed first tokens on an idle replica, at the true rate."""
    for _ in range(n):
        tokens = 20 * 150 ** rng.random()
        speed.observe_prefill(tokens, 0.0, tokens / RATE)


def test_a_full_window_of_first_tokens_leaves_the_engine_intervals_out() -> None:
    speed = ReplicaSpeed(SpeedConfig(window=64))  # refits every 8 once the windows are full
    rng = random.Random(2)
    shared_step_intervals(speed, rng, 64)
    assert speed.prefill_tokens_per_s < 0.5 * RATE  # alone they teach a rate 3x too slow
    first_tokens(speed, rng, 63)  # one short of a full window: the intervals still count
    assert speed.prefill_tokens_per_s < 0.98 * RATE
    first_tokens(speed, rng, 8)  # a full window of them, refitted: the intervals are left out
    assert speed.prefill_tokens_per_s == pytest.approx(RATE, rel=0.01)
    assert speed.engine_observations == 64  # kept, not fitted
    # Answers that came whole (20 decode steps at the prior 15 ms): the intervals stand in
    # for the first tokens the router does not see, and are fitted again.
    for _ in range(8):
        speed.observe_first_token(0.0, 0.0, False, 1000.0, 0.2 + 0.3, after=(0.0, 20, 0.0))
    assert speed.prefill_tokens_per_s < 0.98 * RATE


def test_a_negative_overhead_prior_is_rejected() -> None:
    with pytest.raises(ConfigError):
        SpeedConfig(first_token_overhead_s=-0.01)
