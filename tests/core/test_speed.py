"""Tests for prefixroute.core.speed: each replica's prefill rate and decode step, learned online.

The observations come from a known true model (``seconds = tokens / rate + steps * step``) with
the noise a batch engine makes: a request lands anywhere inside the step under way, and decode
phases jitter. Each robustness test also shows that its data would break a naive estimator, so
it fails if the robustness goes.
"""

from __future__ import annotations

import math
import random

import pytest

from prefixroute.core import (
    BlockHasher,
    ConfigError,
    Decision,
    DecisionReason,
    LoadTracker,
    ReplicaId,
    ReplicaSpeed,
    RequestView,
    Router,
    SpeedConfig,
    make_policy,
)
from prefixroute.core.policies import RoutingContext

R0, R1 = ReplicaId("r0"), ReplicaId("r1")
PRIOR = SpeedConfig()  # 10,000 tokens/s, 15 ms
TOLERANCE = 0.15


def feed(
    speed: ReplicaSpeed,
    rng: random.Random,
    rate: float,
    step: float,
    requests: int,
    ttft_outliers: float = 0.0,
    decode_outliers: float = 0.0,
) -> None:
    """``requests`` requests' two observations each, from the true ``rate`` and ``step``."""
    for _ in range(requests):
        tokens = rng.uniform(50, 4000)
        decoding = rng.random() < 0.7
        steps = speed.steps(tokens, decoding)
        ttft = tokens / rate + steps * step + (rng.uniform(-0.5, 0.5) * step if decoding else 0.0)
        if rng.random() < ttft_outliers:
            ttft *= 10.0  # a stall: the network, a pause, a retry
        speed.observe_prefill(tokens, steps, max(0.0, ttft))
        n = rng.randrange(20, 300)
        # Others' prefill in its decode steps: from none to three times the decode time.
        prefilled = n * rng.uniform(0, 3 * step * rate)
        duration = (n * step + prefilled / rate) * (1.0 + rng.gauss(0.0, 0.05))
        if rng.random() < decode_outliers:
            duration *= 10.0
        speed.observe_decode(duration, n, prefilled)


def off(estimate: float, true: float) -> float:
    return abs(estimate / true - 1.0)


def test_priors_until_enough_observations() -> None:
    cfg = SpeedConfig(prefill_tokens_per_s=12_000.0, decode_step_s=0.02, min_observations=8)
    speed = ReplicaSpeed(cfg)
    assert (speed.prefill_tokens_per_s, speed.decode_step_s) == (12_000.0, 0.02)
    for _ in range(7):  # 7 observations of a replica twice as slow: still the priors
        speed.observe_prefill(1000.0, 0.0, 0.2)
    assert (speed.prefill_tokens_per_s, speed.decode_step_s) == (12_000.0, 0.02)
    speed.observe_prefill(1000.0, 0.0, 0.2)
    assert speed.prefill_tokens_per_s < 12_000.0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("rate", "step"), [(5_000.0, 0.02), (20_000.0, 0.015), (2_500.0, 0.04)])
def test_learns_rate_and_step_within_15_percent_after_200_requests(
    seed: int, rate: float, step: float
) -> None:
    speed = ReplicaSpeed(PRIOR)
    feed(speed, random.Random(seed), rate, step, 200)
    assert off(speed.prefill_tokens_per_s, rate) <= TOLERANCE
    assert off(speed.decode_step_s, step) <= TOLERANCE


@pytest.mark.parametrize("seed", range(3))
def test_follows_a_slowdown_within_200_requests(seed: int) -> None:
    rng = random.Random(seed)
    speed = ReplicaSpeed(PRIOR)
    feed(speed, rng, 20_000.0, 0.015, 200)
    assert off(speed.prefill_tokens_per_s, 20_000.0) <= TOLERANCE
    feed(speed, rng, 5_000.0, 0.015, 200)  # another job now shares the GPU
    assert off(speed.prefill_tokens_per_s, 5_000.0) <= TOLERANCE
    feed(speed, rng, 20_000.0, 0.015, 200)  # and leaves again
    assert off(speed.prefill_tokens_per_s, 20_000.0) <= TOLERANCE


@pytest.mark.parametrize("seed", range(3))
def test_ignores_outliers(seed: int) -> None:
    def learned(cfg: SpeedConfig) -> ReplicaSpeed:
        speed = ReplicaSpeed(cfg)
        feed(speed, random.Random(seed), 5_000.0, 0.02, 200, ttft_outliers=0.1,
             decode_outliers=0.05)  # fmt: skip
        return speed

    robust = learned(PRIOR)
    assert off(robust.prefill_tokens_per_s, 5_000.0) <= TOLERANCE
    assert off(robust.decode_step_s, 0.02) <= TOLERANCE
    assert robust.outliers > 0
    # The same data, every observation kept: the stalls drag the estimates far off.
    naive = learned(SpeedConfig(outlier_factor=1e12))
    assert max(off(naive.prefill_tokens_per_s, 5_000.0), off(naive.decode_step_s, 0.02)) > 0.3


def test_estimates_stay_within_the_bounds() -> None:
    speed = ReplicaSpeed(SpeedConfig(bound=4.0, min_observations=1))
    for _ in range(50):
        speed.observe_prefill(2000.0, 0.0, 1e-7)  # absurdly fast
    assert speed.prefill_tokens_per_s == pytest.approx(40_000.0)
    for _ in range(100):
        speed.observe_prefill(10.0, 0.0, 100.0)  # absurdly slow
    assert speed.prefill_tokens_per_s == pytest.approx(2_500.0)


def test_learning_off_keeps_the_priors() -> None:
    speed = ReplicaSpeed(SpeedConfig(learn=False))
    feed(speed, random.Random(0), 2_500.0, 0.04, 100)
    assert (speed.prefill_tokens_per_s, speed.decode_step_s) == (10_000.0, 0.015)
    assert speed.prefill_observations == 0


def test_bad_config_is_rejected() -> None:
    for bad in ({"prefill_tokens_per_s": 0.0}, {"window": 1}, {"bound": 0.5},
                {"outlier_factor": 1.0}, {"decode_step_s": -1.0}):  # fmt: skip
        with pytest.raises(ConfigError):
            SpeedConfig(**bad)


def test_progress_credits_elapsed_work_never_more_than_queued() -> None:
    speed = ReplicaSpeed(PRIOR)
    assert speed.progress(4000.0, 0.1, decoding=False) == pytest.approx(1000.0)
    # Decoding: the step under way spent 15 ms on decodes.
    assert speed.progress(4000.0, 0.1, decoding=True) == pytest.approx(850.0)
    assert speed.progress(500.0, 10.0, decoding=False) == 500.0
    assert speed.progress(500.0, 0.0, decoding=False) == 0.0
    assert speed.progress(0.0, 1.0, decoding=False) == 0.0


# --- fed by the load view -----------------------------------------------------------------
def view(request_id: str, prompt: int, output: int = 10) -> RequestView:
    return RequestView(request_id, (), 16, prompt, prompt, output)


def send(tracker: LoadTracker, rid: str, prompt: int, now: float, cached: int = 0) -> None:
    tracker.dispatch(view(rid, prompt), Decision(R0, DecisionReason.LEAST_LOADED, cached), now)


def one_step() -> LoadTracker:
    return LoadTracker(speed=SpeedConfig(min_observations=1))


def test_only_measured_first_tokens_teach() -> None:
    tracker = one_step()
    send(tracker, "guess", 1000, 0.0)
    tracker.first_token("guess", 0.5, measured=False)  # a timer, not a token
    tracker.complete("guess", 1.0, output_tokens=10)
    send(tracker, "failed", 1000, 2.0)
    tracker.complete("failed", 2.5)  # no first token at all
    speed = tracker[R0].speed
    assert (speed.prefill_observations, speed.decode_observations) == (0, 0)
    assert speed.prefill_tokens_per_s == 10_000.0
    send(tracker, "real", 1000, 3.0)
    tracker.first_token("real", 3.4)
    tracker.complete("real", 4.0)  # output unknown: no decode observation
    assert (speed.prefill_observations, speed.decode_observations) == (1, 0)
    assert speed.prefill_tokens_per_s < 10_000.0  # 1,000 tokens took 0.4 s
    send(tracker, "full", 1000, 5.0)
    tracker.first_token("full", 5.4)
    tracker.complete("full", 6.0, output_tokens=10)
    assert (speed.prefill_observations, speed.decode_observations) == (2, 1)


def test_reported_usage_replaces_the_predicted_uncached_tokens() -> None:
    def rate_after(usage: bool) -> float:
        tracker = one_step()
        # Predicted 900 of 1,000 tokens cached; the replica had evicted them: all 1,000 computed.
        send(tracker, "a", 1000, 0.0, cached=900)
        tracker.first_token("a", 0.1)
        if usage:
            tracker.observe_usage("a", prompt_tokens=1000, cached_tokens=0)
        tracker.complete("a", 0.2)
        return tracker[R0].speed.prefill_tokens_per_s

    # 1,000 tokens in 0.1 s is the prior's 10,000 tokens/s; 100 tokens in 0.1 s would be 1,000.
    assert rate_after(usage=True) == pytest.approx(10_000.0)
    assert rate_after(usage=False) < 6_000.0


def test_queued_work_in_seconds_at_the_replica_s_own_speed() -> None:
    tracker = LoadTracker()
    send(tracker, "a", 5000, 0.0)
    load = tracker[R0]
    assert load.queued_prefill_s(0.0) == pytest.approx(0.5)  # the prior: 10,000 tokens/s
    feed(load.speed, random.Random(0), 2_500.0, 0.015, 200)
    assert load.queued_prefill_s(0.0) == pytest.approx(2.0, rel=TOLERANCE)
    # Half a second later, half a second of it is done (the replica is not decoding).
    assert load.queued_prefill_s(0.5) == pytest.approx(load.queued_prefill_s(0.0) - 0.5)
    assert load.queued_prefill_s(60.0) == 0.0


# --- the router and the default policy ---------------------------------------------------
def test_speed_priors_come_from_the_policy_config() -> None:
    router = Router(make_policy("predicted_ttft", prefill_tokens_per_s=20_000.0,
                                decode_step_s=0.03, step_tokens=1024))  # fmt: skip
    router.add_replica(R0)
    speed = router.loads[R0].speed
    assert (speed.prefill_tokens_per_s, speed.decode_step_s) == (20_000.0, 0.03)
    assert speed.config.step_tokens == 1024
    plain = Router(make_policy("round_robin"))
    plain.add_replica(R0)
    assert plain.loads[R0].speed.prefill_tokens_per_s == PRIOR.prefill_tokens_per_s


def test_router_counts_overpredicted_cache_hits() -> None:
    router = Router(make_policy("round_robin"), BlockHasher(block_size=1))
    router.add_replica(R0)
    for rid, actual_cached in (("a", 0), ("b", 50)):
        router.route(router.view(rid, tokens=list(range(100))), 0.0)
        router.observe_usage(rid, prompt_tokens=100, cached_tokens=actual_cached)
        router.complete(rid, 1.0)
    router.observe_usage("gone", prompt_tokens=100, cached_tokens=0)  # not in flight: ignored
    # "a" was predicted uncached (nothing indexed yet); "b" was predicted 99 cached, found 50.
    assert (router.usage_reports, router.overpredicted, router.overpredicted_tokens) == (2, 1, 49)


def two_replicas(seed: int, **params: object) -> Router:
    router = Router(make_policy("predicted_ttft", **params), BlockHasher(block_size=16), seed=seed)
    router.add_replica(R0)
    router.add_replica(R1)
    return router


def teach(router: Router, replica: ReplicaId, rate: float) -> None:
    feed(router.loads[replica].speed, random.Random(1), rate, 0.015, 100)


@pytest.mark.parametrize("seed", range(8))
def test_default_policy_sends_a_cold_prompt_to_the_replica_learned_faster(seed: int) -> None:
    prompt = list(range(2000))
    router = two_replicas(seed)
    teach(router, R0, 2_500.0)
    teach(router, R1, 10_000.0)
    assert router.route(router.view("a", tokens=prompt), 0.0).replica == R1


def test_with_fixed_speeds_the_same_choice_is_a_coin_flip() -> None:
    chosen = set()
    for seed in range(16):
        router = two_replicas(seed, learned_speeds=False)
        teach(router, R0, 2_500.0)
        teach(router, R1, 10_000.0)
        chosen.add(router.route(router.view("a", tokens=list(range(2000))), 0.0).replica)
    assert chosen == {R0, R1}


def test_a_fresh_router_predicts_with_the_configured_constants() -> None:
    """No speed learned yet: the same predictions as the fixed constants, to the bit."""
    for params in ({}, {"prefill_tokens_per_s": 7_000.0, "decode_step_s": 0.02}):
        learned, fixed = two_replicas(0, **params), two_replicas(0, learned_speeds=False, **params)
        for router in (learned, fixed):
            router.route(router.view("busy", tokens=list(range(3000))), 0.0)
            router.first_token("busy", 0.01, measured=False)
            router.route(router.view("queued", tokens=list(range(5000, 9000))), 0.02)
        req = learned.view("new", tokens=list(range(20_000, 23_000)))
        for r in (R0, R1):
            predictions = []
            for router in (learned, fixed):
                ctx = RoutingContext(req, [R0, R1], router.index, router.loads, router.rng, 0.03)
                policy = router.policy
                predictions.append(policy.predict(ctx, r) + policy.cost_to_others(ctx, r))  # type: ignore[attr-defined]
            assert predictions[0] == predictions[1]
            assert math.isfinite(predictions[0])
