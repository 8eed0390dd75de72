"""Attention in the speed model (core/context_cost.py): a prompt token costs more the longer the
context before it, and the router learns how much per replica.

From the module docstrings: a request with ``cached`` tokens in the cache and ``uncached`` to
compute carries ``uncached * (cached + uncached / 2) / 1000`` token-kilotokens of context work;
``attention`` (seconds per token per 1k tokens of context) is one more unknown of the speed fit,
prior 0 and never negative; the load view sums each replica's queued context work as it sums
its queued tokens; ``predicted_ttft`` adds ``attention * (queued context + ours)`` to a
prediction and counts our own attention seconds in the cost to others.
"""

from __future__ import annotations

import random

import pytest

from prefixroute.core import LoadTracker, ReplicaId, SpeedConfig, SpeedPrior, make_policy
from prefixroute.core.context_cost import context_work, doubling_context

from .helpers import NAMES, R0, context, make_router, tokens

RATE = 10_000.0  # the replica's linear prefill rate, tokens/s
DOUBLING = 4_000.0  # context at which its prompt token costs double, tokens
ATTENTION = 1_000.0 / (RATE * DOUBLING)  # seconds per token per 1k tokens of context
STEP = 0.015  # its decode step, seconds


def true_prefill_s(
    cached: int, uncached: int, attention: float = ATTENTION, rate: float = RATE
) -> float:
    """A prefill on a replica whose token ``i`` after ``cached`` costs ``1/rate +
    attention * (cached + i) / 1000`` seconds (the simulator's replica model)."""
    return uncached / rate + attention * uncached * (cached + uncached / 2) / 1000.0


def serve(
    config: SpeedConfig, requests: int, attention: float, rate: float = RATE, seed: int = 0
) -> LoadTracker:
    """One replica, requests one after another (no queue): prompts of 200-6,000 tokens with
    0-90% of them cached, each first token at its true prefill time, then 9 decode steps."""
    tracker = LoadTracker(speed=config)
    rng = random.Random(seed)
    now = 0.0
    for i in range(requests):
        prompt = rng.randint(200, 6000)
        cached = int(prompt * rng.uniform(0.0, 0.9))
        rid = f"q{i}"
        tracker.count_dispatch(
            rid, R0, prompt_tokens=prompt, output_tokens=10, predicted_cached_tokens=cached,
            now=now,
        )  # fmt: skip
        first = now + true_prefill_s(cached, prompt - cached, attention, rate)
        tracker.first_token(rid, first)
        tracker.complete(rid, first + 9 * STEP, 10)
        now = first + 1.0
    return tracker


def test_context_work_is_each_new_token_attending_to_what_is_before_it() -> None:
    assert context_work(0, 1000) == 1000 * 500 / 1000
    assert context_work(3000, 1000) == 1000 * 3500 / 1000
    assert context_work(3000, 0) == 0.0
    assert context_work(-5, 10) == 10 * 5 / 1000  # no negative context
    assert doubling_context(RATE, ATTENTION) == pytest.approx(DOUBLING)
    assert doubling_context(RATE, 0.0) is None


def test_the_linear_rate_and_the_attention_are_learned_apart() -> None:
    speed = serve(SpeedConfig(decode_step_s=STEP), 200, ATTENTION)[R0].speed
    assert speed.prefill_tokens_per_s == pytest.approx(RATE, rel=0.05)
    assert speed.attention_s == pytest.approx(ATTENTION, rel=0.15)
    assert speed.snapshot()["attention_tokens"] == pytest.approx(DOUBLING, rel=0.15)
    # A long prompt with nothing cached, and a short question behind a long cached context:
    # both predicted within 5%.
    for cached, uncached in ((0, 8000), (6000, 200)):
        predicted = speed.prefill_s(uncached, context_work(cached, uncached))
        assert predicted == pytest.approx(true_prefill_s(cached, uncached), rel=0.05)


def test_without_the_term_the_rate_is_an_average_that_mispredicts() -> None:
    """What the term is for: the linear model learns an effective rate, too slow for a short
    question after a long cached context and too fast for a long fresh prompt."""
    speed = serve(SpeedConfig(decode_step_s=STEP, learn_attention=False), 200, ATTENTION)[R0].speed
    assert speed.attention_s == 0.0
    assert speed.prefill_tokens_per_s < 0.85 * RATE
    assert speed.prefill_s(8000) < 0.9 * true_prefill_s(0, 8000)


def test_a_replica_without_attention_keeps_the_linear_model() -> None:
    """Prior 0, and the prior rate counts the typical context: a linear replica (at half the
    prior rate, so that the prior pulls) learns no attention and the same rate as a model
    without the term. Were the prior on the rate alone, attention would be a way round it."""
    cfg = SpeedConfig(decode_step_s=STEP)
    linear = serve(cfg, 200, 0.0, rate=RATE / 2)[R0].speed
    without = serve(SpeedConfig(decode_step_s=STEP, learn_attention=False), 200, 0.0, RATE / 2)
    assert linear.attention_s < ATTENTION / 50
    rate = without[R0].speed.prefill_tokens_per_s
    assert linear.prefill_tokens_per_s == pytest.approx(rate, rel=0.01)
    assert linear.prefill_tokens_per_s == pytest.approx(RATE / 2, rel=0.02)


def test_the_load_view_sums_the_queued_context_work() -> None:
    tracker = LoadTracker()
    tracker.count_dispatch("a", R0, prompt_tokens=3000, output_tokens=5,
                           predicted_cached_tokens=2000, now=0.0)  # fmt: skip
    tracker.count_dispatch("b", R0, prompt_tokens=500, output_tokens=5,
                           predicted_cached_tokens=0, now=0.0)  # fmt: skip
    load = tracker[R0]
    a, b = context_work(2000, 1000), context_work(0, 500)
    assert load.queued_context == pytest.approx(a + b)
    assert load.dispatched_context == pytest.approx(a + b)
    tracker.first_token("a", 0.5)
    assert load.queued_context == pytest.approx(b)
    assert load.prefilled_context == pytest.approx(a)
    tracker.first_token("b", 0.6)
    assert load.queued_context == 0.0
    assert load.prefilled_context == pytest.approx(a + b)


def test_the_wait_in_seconds_counts_the_queue_context() -> None:
    tracker = LoadTracker()
    tracker.count_dispatch("a", R0, prompt_tokens=3000, output_tokens=5,
                           predicted_cached_tokens=2000, now=0.0)  # fmt: skip
    load = tracker[R0]
    load.speed.attention_s = ATTENTION
    rate = load.speed.prefill_tokens_per_s
    assert load.queued_prefill_s(0.0) == pytest.approx(
        1000 / rate + ATTENTION * context_work(2000, 1000)
    )
    # Half the queue's time gone: half its tokens and half its context work left.
    half = load.queued_prefill_s(0.0) / 2
    assert load.queued_prefill_s(half) == pytest.approx(load.queued_prefill_s(0.0) / 2)


def test_a_decode_phase_and_an_engine_report_carry_context_work() -> None:
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=STEP))
    tracker.count_dispatch("a", R0, prompt_tokens=100, output_tokens=50,
                           predicted_cached_tokens=0, now=0.0)  # fmt: skip
    tracker.first_token("a", 0.1)
    tracker.count_dispatch("b", R0, prompt_tokens=4000, output_tokens=5,
                           predicted_cached_tokens=1000, now=0.2)  # fmt: skip
    tracker.first_token("b", 0.9)  # prefilled while "a" decoded
    tracker.complete("a", 1.5, 50)
    speed = tracker[R0].speed
    decode = speed._decode[-1]
    assert decode.x[0] == 3000 and decode.x[4] == pytest.approx(context_work(1000, 3000))
    per_token = (context_work(0, 100) + context_work(1000, 3000)) / 3100
    tracker.observe_engine_prefill(R0, 1000, 2, 0.3)
    engine = speed._engine[-1]
    assert engine.x[0] == 1000 and engine.x[4] == pytest.approx(1000 * per_token)


def test_predicted_ttft_adds_the_attention_of_the_queue_and_its_own() -> None:
    policy = make_policy("predicted_ttft")
    router = make_router("predicted_ttft")
    loads = router.loads
    r1: ReplicaId = NAMES[1]
    loads.count_dispatch("q", r1, prompt_tokens=3000, output_tokens=5,
                         predicted_cached_tokens=1000, now=0.0)  # fmt: skip
    loads[r1].speed.attention_s = ATTENTION
    ctx = context(router, tokens(1200))
    rate = loads[r1].speed.prefill_tokens_per_s
    queued = context_work(1000, 2000)
    own = context_work(0, 1200)
    expected = (2000 + 1200) / rate + ATTENTION * (queued + own)
    assert policy.predict(ctx, r1) == pytest.approx(expected, rel=1e-12)
    # Cost to others: the recomputation at miss_penalty per second of it, attention included
    # (nobody prefilling there yet when the first chunk would interfere: q is, so 1 x 1200).
    cfg = policy.config  # type: ignore[attr-defined]
    cost = (cfg.miss_penalty * 1200 + cfg.interference * 1200) / rate
    assert policy.cost_to_others(ctx, r1) == pytest.approx(
        cost + cfg.miss_penalty * ATTENTION * own, rel=1e-12
    )
    # Where attention is 0 (r0: nothing learned), neither term has any.
    assert policy.predict(ctx, R0) == pytest.approx(1200 / rate, rel=1e-12)


def test_a_queue_of_long_context_work_loses_to_a_longer_queue_of_short_context() -> None:
    """Queues compared in seconds, attention included: r1's 2,000 queued tokens follow 20,000
    cached ones and take 1.25 s at its learned attention, r0's 3,000 fresh ones 0.41 s. Counted
    in tokens alone (no attention learned), r1 would look sooner."""
    router = make_router("predicted_ttft", n=2)
    loads = router.loads
    r1: ReplicaId = NAMES[1]
    loads.count_dispatch("a", R0, prompt_tokens=3000, output_tokens=5,
                         predicted_cached_tokens=0, now=0.0)  # fmt: skip
    loads.count_dispatch("b", r1, prompt_tokens=22000, output_tokens=5,
                         predicted_cached_tokens=20000, now=0.0)  # fmt: skip
    ctx = context(router, tokens(500))
    policy = router.policy
    assert policy.decide(ctx).replica == r1  # linear: 2,000 tokens before 3,000
    for r in (R0, r1):
        loads[r].speed.attention_s = ATTENTION
    assert policy.decide(context(router, tokens(500))).replica == R0


def dispatch(tracker: LoadTracker, rid: str, prompt: int, cached: int, now: float) -> None:
    tracker.count_dispatch(rid, R0, prompt_tokens=prompt, output_tokens=5,
                           predicted_cached_tokens=cached, now=now)  # fmt: skip


def test_a_first_token_teaches_the_queue_context_and_its_own() -> None:
    tracker = LoadTracker()
    dispatch(tracker, "a", 3000, 2000, 0.0)
    dispatch(tracker, "b", 800, 0, 0.0)
    a, b = context_work(2000, 1000), context_work(0, 800)
    tracker.tell(R0, SpeedPrior(prefill_tokens_per_s=RATE))  # its speed is its own: predicted
    speed = tracker[R0].speed
    speed.attention_s = ATTENTION
    due = tracker.first_token_due("b")  # behind a, at the estimates of the moment
    rate = speed.prefill_tokens_per_s
    assert due == pytest.approx(1800 / rate + ATTENTION * (a + b), rel=1e-9)
    tracker.first_token("a", 0.4)
    tracker.first_token("b", 0.5)
    tracker.complete("b", 0.6, 5)
    obs = speed._prefill[-1]
    assert (obs.queued_context, obs.own_context) == pytest.approx((a, b))
    # a reports 2,500 cached, not 2,000: b waited behind 500 tokens after 2,500 cached.
    tracker.observe_usage("a", 3000, 2500)
    assert obs.queued == 500
    assert obs.queued_context == pytest.approx(context_work(2500, 500))


def test_a_first_token_taught_early_is_corrected_with_its_own_context() -> None:
    """A warming replica's first token far off its prediction teaches at once (inflight.py);
    the replica's own count then corrects its uncached tokens and its context work."""
    tracker = LoadTracker()
    dispatch(tracker, "x", 4000, 0, 0.0)
    tracker.first_token("x", 5.0)  # 10x the prediction: taught now
    obs = tracker[R0].speed._prefill[-1]
    assert obs.own_context == pytest.approx(context_work(0, 4000))
    tracker.observe_usage("x", 4000, 3000)
    tracker.complete("x", 5.1, 5)
    assert obs.own == 1000
    assert obs.own_context == pytest.approx(context_work(3000, 1000))


def test_a_whole_answer_teaches_the_queue_context_too() -> None:
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=STEP))
    tracker.get(R0)
    tracker.tell(R0, SpeedPrior(prefill_tokens_per_s=RATE))  # the queue ahead is known
    dispatch(tracker, "a", 3000, 2000, 0.0)
    dispatch(tracker, "b", 800, 0, 0.0)
    tracker.first_token("a", 0.1)
    tracker.complete("b", 1.0, 5, whole=True)
    obs = tracker[R0].speed._prefill[-1]
    assert obs.whole
    assert (obs.queued_context, obs.own_context) == pytest.approx(
        (context_work(2000, 1000), context_work(0, 800))
    )


def test_a_guess_waits_for_the_context_work_ahead() -> None:
    """A plain answer's guessed first token behind another's (core/plain_answers.py): the wait
    is the work ahead and its own, attention included, at the replica's speed."""
    tracker = LoadTracker()
    dispatch(tracker, "a", 3000, 2000, 0.0)
    dispatch(tracker, "b", 800, 0, 0.0)
    tracker.tell(R0, SpeedPrior(prefill_tokens_per_s=RATE))  # its speed is its own: guessed
    speed = tracker[R0].speed
    speed.attention_s = ATTENTION
    assert tracker.first_token_due("a") is not None
    assert tracker.first_token_due("b") is not None
    wait = tracker.guess_first_token("b", 0.0)  # a is still ahead of it
    expected = 1800 / RATE + ATTENTION * (context_work(2000, 1000) + context_work(0, 800))
    assert wait == pytest.approx(expected, rel=1e-9)


def test_an_empty_queue_waits_for_nothing() -> None:
    tracker = LoadTracker()
    tracker.get(R0).speed.attention_s = ATTENTION
    assert tracker[R0].queued_prefill_s(0.0) == 0.0


def test_the_effective_rate_is_what_the_first_tokens_measured_at_their_context() -> None:
    """``speed.effective_prefill_tokens_per_s`` (docs/gateway.md): the rate with attention at
    the replica's typical context, what it really prefills. Measured here from the traffic
    itself: multi-turn-shaped prompts (2,000-3,000 tokens cached, 100-300 new) on a replica
    with attention, its tokens over its true prefill seconds."""
    tracker = LoadTracker(speed=SpeedConfig(decode_step_s=STEP))
    rng = random.Random(3)
    now, tokens, seconds = 0.0, 0.0, 0.0
    for i in range(200):
        cached, uncached = rng.randint(2000, 3000), rng.randint(100, 300)
        rid = f"t{i}"
        tracker.count_dispatch(
            rid, R0, prompt_tokens=cached + uncached, output_tokens=10,
            predicted_cached_tokens=cached, now=now,
        )  # fmt: skip
        took = true_prefill_s(cached, uncached)
        tokens, seconds = tokens + uncached, seconds + took
        tracker.first_token(rid, now + took)
        tracker.complete(rid, now + took + 9 * STEP, 10)
        now += took + 1.0
    speed = tracker[R0].speed
    measured = tokens / seconds  # about 7,000 tokens/s: a third of a token's cost is attention
    assert measured < 0.8 * RATE
    assert speed.snapshot()["effective_prefill_tokens_per_s"] == pytest.approx(measured, rel=0.05)
    # No attention learned: the effective rate is the rate.
    linear = serve(SpeedConfig(decode_step_s=STEP, learn_attention=False), 100, ATTENTION)
    plain = linear[R0].speed.snapshot()
    assert plain["effective_prefill_tokens_per_s"] == plain["prefill_tokens_per_s"]
