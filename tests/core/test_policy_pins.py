"""Each policy's documented rule, pinned at its numbers and boundaries (docs/mutation.md).

The expected values come from the module docstrings and the README's policy table, worked by
hand: a test that recomputed them with the code under test would pass whatever the code did.
Where several replicas could tie and the policy breaks ties at random, the test either makes the
tie impossible or checks every one of a fixed list of seeds, so no result rests on a coin flip.

Block size 1 throughout (a token is a block); load is set through the router's one bookkeeping
path, cache contents through ``router.index.insert``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from prefixroute.core import (
    ConfigError,
    Decision,
    DecisionReason,
    ReplicaId,
    Router,
    make_policy,
)

from .helpers import (
    NAMES,
    R0,
    R1,
    R2,
    R3,
    arrivals,
    busy,
    busy_each,
    context,
    context_of,
    dispatch,
    make_router,
    prime,
    router_over,
    tokens,
)

SEEDS = range(12)  # a rule that holds for every one of these is not a coin flip (2^-12)
_ids = itertools.count()

# predicted_ttft's defaults, as its config documents them
RATE = 10_000.0  # prefill tokens/s
STEP = 2048  # tokens per batch step
DECODE = 0.015  # s per decoding step
NO_PENALTIES = {"miss_penalty": 0.0, "interference": 0.0, "arrivals": 0.0}


def route(router: Router, toks: Sequence[int], now: float = 0.0) -> Decision:
    return router.route(router.view(f"q{next(_ids)}", tokens=toks), now)


# --- predicted_ttft: the prediction, term by term (its module docstring) ----------------------


def test_ttft_of_an_idle_replica_is_the_prompt_at_the_prefill_rate() -> None:
    router = make_router("predicted_ttft")
    prime(router, R1, tokens(300))
    ctx = context(router, tokens(1000))
    policy = router.policy
    assert policy.predict(ctx, R0) == pytest.approx(1000 / RATE)  # type: ignore[attr-defined]
    assert policy.predict(ctx, R1) == pytest.approx(700 / RATE)  # type: ignore[attr-defined]


def test_ttft_counts_queued_prefill_but_no_decode_steps_while_nothing_decodes() -> None:
    router = make_router("predicted_ttft")
    busy(router, R0, 2, prompt=1500)  # two prompts still prefilling: 3000 tokens ahead
    ctx = context(router, tokens(1000))
    assert router.policy.predict(ctx, R0) == pytest.approx(4000 / RATE)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("queued", "prompt", "steps"),
    [(0, 1000, 1), (0, 2048, 1), (0, 2049, 2), (1500, 1000, 2), (3000, 3000, 3)],
)
def test_ttft_on_a_decoding_replica_adds_a_decode_step_per_prefill_step_plus_half(
    queued: int, prompt: int, steps: int
) -> None:
    # ttft = work / rate + (ceil(work / step_tokens) + 1/2) * decode_step_s, work = queue + ours.
    # The prompts stay within one step's worth of uncached tokens, so no arrivals term.
    router = make_router("predicted_ttft", arrivals=0.0)
    busy(router, R0, prompt=8, prefilled=True)  # decoding
    if queued:
        busy(router, R0, prompt=queued)  # prefilling ahead of us
    ctx = context(router, tokens(prompt, start=50_000))
    work = queued + prompt
    expected = work / RATE + (steps + 0.5) * DECODE
    assert router.policy.predict(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]


def test_arrivals_term_counts_chunks_of_recent_arrivals_riding_along_a_long_prefill() -> None:
    # + arrival_rate(r) * ttft * mean_uncached(r) / prefill_rate, when our uncached prompt
    # spans several steps. 49 past requests of 200 tokens and one decoding request of 100
    # tokens, all at t=0: 50 arrivals in the 10 s window, 5 per second, 198 tokens on average.
    router = make_router("predicted_ttft")
    busy(router, R0, prompt=100, prefilled=True)
    arrivals(router, R0, 49, 200)
    load = router.loads[R0]
    assert load.arrival_rate(0.0) == pytest.approx(5.0)
    assert load.mean_uncached() == pytest.approx(198.0)
    ctx = context(router, tokens(5000, start=70_000))
    base = 5000 / RATE + (3 + 0.5) * DECODE
    expected = base + 5.0 * base * 198.0 / RATE
    assert router.policy.predict(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]


@pytest.mark.parametrize("prompt", [2048, 1000])
def test_no_arrivals_term_for_a_prompt_within_one_step(prompt: int) -> None:
    router = make_router("predicted_ttft")
    busy(router, R0, prompt=100, prefilled=True)
    arrivals(router, R0, 49, 200)
    ctx = context(router, tokens(prompt, start=70_000))
    expected = prompt / RATE + 1.5 * DECODE
    assert router.policy.predict(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]


def test_arrivals_term_decides_between_equal_queues_without_a_coin_flip() -> None:
    # R0 caches 500 tokens of the prompt, but 100 requests arrived there lately; R1 has none
    # cached and one arrival. Without the arrivals term R0 wins by 0.075 s (cached tokens and
    # miss penalty); with it, R0's 4,500-token prefill shares its steps with ~0.1 s of other
    # requests' chunks, and R1 wins by about 0.025 s: far outside the 2 ms tie tolerance.
    for seed in SEEDS:
        router = make_router("predicted_ttft", n=2, seed=seed)
        prompt = tokens(5000, start=70_000)
        prime(router, R0, prompt[:500])
        busy(router, R0, prompt=100, prefilled=True)
        busy(router, R1, prompt=100, prefilled=True)
        arrivals(router, R0, 99, 200)
        d = route(router, prompt)
        assert (d.replica, d.reason) == (R1, DecisionReason.HOT_SPOT_YIELD)
    router = make_router("predicted_ttft", n=2, arrivals=0.0)
    prompt = tokens(5000, start=70_000)
    prime(router, R0, prompt[:500])
    busy(router, R0, prompt=100, prefilled=True)
    busy(router, R1, prompt=100, prefilled=True)
    arrivals(router, R0, 99, 200)
    assert route(router, prompt).replica == R0


# --- predicted_ttft: the cost to others -------------------------------------------------------


def test_cost_to_others_is_zero_on_an_idle_replica() -> None:
    router = make_router("predicted_ttft")
    ctx = context(router, tokens(5000))
    assert router.policy.cost_to_others(ctx, R0) == 0.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(("prompt", "first_chunk"), [(1000, 1000), (5000, STEP)])
def test_cost_to_others_is_miss_penalty_plus_interference_capped_at_one_step(
    prompt: int, first_chunk: int
) -> None:
    # (miss_penalty * uncached + interference * prefilling * min(uncached, step)) / rate,
    # with miss_penalty 0.5 and interference 1.0; one decoding and two prefilling requests.
    router = make_router("predicted_ttft")
    busy(router, R0, prompt=10, prefilled=True)
    busy(router, R0, 2, prompt=10)
    ctx = context(router, tokens(prompt, start=50_000))
    expected = (0.5 * prompt + 1.0 * 2 * first_chunk) / RATE
    assert router.policy.cost_to_others(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]


def test_cost_to_others_counts_only_the_uncached_part() -> None:
    # 1,000-token prompt, 400 cached on R0 (one decoding request there, nothing prefilling):
    # the cost is the miss penalty on the 600 uncached tokens only.
    router = make_router("predicted_ttft")
    prompt = tokens(1000, start=50_000)
    prime(router, R0, prompt[:400])
    busy(router, R0, prompt=10, prefilled=True)
    ctx = context(router, prompt)
    cost = router.policy.cost_to_others(ctx, R0)  # type: ignore[attr-defined]
    assert cost == pytest.approx(0.5 * 600 / RATE)


@pytest.mark.parametrize("name", ["cache_aware", "prefix_affinity"])
def test_an_empty_prompt_is_a_weak_match_on_the_smallest_tree(name: str) -> None:
    router = make_router(name)
    for i, r in enumerate((R0, R1, R3)):
        prime(router, r, tokens(5, start=900_000 + 100 * i))
    d = route(router, [])
    assert (d.replica, d.reason) == (R2, DecisionReason.WEAK_MATCH)


def test_interference_cap_decides_where_a_long_prompt_goes() -> None:
    # A 10,000-token prompt; R0 caches 2,000 of it and has a 1,000-token prompt prefilling,
    # R1 caches nothing and is decoding one request (no queue).
    # R0: ttft 9,000 / rate = 0.9 s; cost (0.5 * 8,000 + 1 * 2,048) / rate = 0.6048 s: 1.5048 s
    #     (without the cap on the first chunk the cost would be 1.2 s: 2.1 s)
    # R1: ttft 1.0 + 5.5 decode steps = 1.0825 s; cost 0.5 * 10,000 / rate = 0.5 s: 1.5825 s
    prompt = tokens(10_000, start=50_000)
    for seed in SEEDS:
        router = make_router("predicted_ttft", n=2, seed=seed, arrivals=0.0)
        prime(router, R0, prompt[:2000])
        busy(router, R0, prompt=1000)
        busy(router, R1, prompt=8, prefilled=True)
        d = route(router, prompt)
        assert (d.replica, d.reason, d.predicted_cached_tokens) == (
            R0,
            DecisionReason.PREFIX_MATCH,
            2000,
        )


# --- predicted_ttft: ties ----------------------------------------------------------------------


def test_a_score_exactly_at_the_tie_tolerance_counts_as_tied() -> None:
    # Numbers exact in binary: rate 1,000 tokens/s, tolerance 0.5 s. R0 (idle, nothing cached)
    # scores 1.0 s; R1 caches half the prompt but has 1,000 tokens queued: 1.5 s, exactly the
    # best plus the tolerance. Tied, so the longer match wins.
    params = dict(NO_PENALTIES, prefill_tokens_per_s=1000.0, tie_tolerance_s=0.5)
    prompt = tokens(1000)
    router = make_router("predicted_ttft", n=2, **params)
    prime(router, R1, prompt[:500])
    busy(router, R1, prompt=1000)
    assert route(router, prompt).replica == R1
    # 1 token more queued: 1.501 s is past the tolerance, and the idle replica wins.
    router = make_router("predicted_ttft", n=2, **params)
    prime(router, R1, prompt[:500])
    busy(router, R1, prompt=1001)
    assert route(router, prompt).replica == R0


def test_among_equal_matches_within_tolerance_fewer_in_flight_wins() -> None:
    # R1 and R2 hold the whole prompt; R1 has two requests in flight, R2 one (empty prompts
    # still prefilling: no queue, no decode steps). With the default penalties R1 and R2 score
    # 0.15 ms and 0.25 ms over plain TTFT (miss penalty and interference for the one uncached
    # token), both within the 2 ms tolerance. R0 and R3 are idle but would compute the whole
    # prompt (0.1 s). Every seed: R2.
    prompt = tokens(1000)
    for seed in SEEDS:
        router = make_router("predicted_ttft", seed=seed)
        prime(router, R1, prompt)
        prime(router, R2, prompt)
        busy(router, R1, 2)
        busy(router, R2, 1)
        d = route(router, prompt)
        assert (d.replica, d.reason) == (R2, DecisionReason.PREFIX_MATCH)


def test_two_way_tie_on_match_is_broken_by_in_flight() -> None:
    # Only two replicas left after the match rule: the in-flight rule still applies.
    prompt = tokens(1000)
    for seed in SEEDS:
        router = make_router("predicted_ttft", n=2, seed=seed, **NO_PENALTIES)
        prime(router, R0, prompt)
        prime(router, R1, prompt)
        busy(router, R0, 3)
        busy(router, R1, 2)
        assert route(router, prompt).replica == R1


@pytest.mark.parametrize("n", [2, 4])
def test_a_complete_tie_is_broken_by_the_seeded_rng_not_by_candidate_order(n: int) -> None:
    # Identical idle replicas: the first request's replica depends on the router's seed only
    # (the same seed, the same replica), and across seeds more than one replica gets it.
    def first(seed: int) -> ReplicaId:
        return route(make_router("predicted_ttft", n=n, seed=seed), tokens(100)).replica

    picks = [first(seed) for seed in SEEDS]
    assert picks == [first(seed) for seed in SEEDS]
    assert len(set(picks)) > 1


# --- predicted_ttft: its config's bounds -------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "bad", "good"),
    [
        ("prefill_tokens_per_s", 0.0, 0.5),  # positive
        ("step_tokens", 0, 1),  # positive
        ("shortlist_above", 1, 2),  # at least 2
        ("shortlist_top", -1, 0),  # at least 0
        ("shortlist_sample", 0, 1),  # at least 1
    ],
)
def test_predicted_ttft_config_bounds(field: str, bad: float, good: float) -> None:
    make_policy("predicted_ttft", **{field: good})
    with pytest.raises(ConfigError) as info:
        make_policy("predicted_ttft", **{field: bad})
    assert str(info.value) in (  # the message states the bound it enforces
        "prefill_tokens_per_s and step_tokens must be positive",
        "shortlist_above must be at least 2, shortlist_top at least 0 and "
        "shortlist_sample at least 1",
    )
    assert field in str(info.value)


# --- random tie-breaks: every policy that documents them ----------------------------------------


@pytest.mark.parametrize("name", ["least_loaded", "weighted_scorer", "kv_cost", "power_of_two"])
@pytest.mark.parametrize("n", [2, 4])
def test_ties_between_identical_replicas_are_broken_at_random_per_seed(name: str, n: int) -> None:
    # least_loaded: "ties at random"; weighted_scorer: "random ties"; kv_cost: "then at random";
    # power_of_two: two random candidates. Identical idle replicas: every one is a tie.
    def first(seed: int) -> ReplicaId:
        return route(make_router(name, n=n, seed=seed), tokens(100)).replica

    picks = [first(seed) for seed in SEEDS]
    assert picks == [first(seed) for seed in SEEDS]  # the seed decides
    assert len(set(picks)) > 1  # not the candidate order


def test_power_of_two_with_one_candidate_takes_it() -> None:
    router = make_router("power_of_two")
    view = router.view("one", tokens=tokens(10))
    for r in NAMES:
        ctx = context_of(router, view, [r])
        assert router.policy.decide(ctx).replica == r


# --- kv_cost: Dynamo's cost (its module docstring) -----------------------------------------------


def test_kv_cost_logit_is_overlap_weight_times_prefill_blocks_plus_decode_blocks() -> None:
    # block_size 16 (the default). 100 queued prefill tokens and 7 active blocks on R0; a
    # 50-token prompt of which 16 are cached there:
    # prefill = (100 + 50 - 16) / 16 = 8.375 blocks, decode = 7 + ceil(50 / 16) = 11 blocks.
    router = router_over("kv_cost", [R0], block_size=16, params={"overlap_weight": 2.0})
    busy(router, R0, prompt=100)
    load = router.loads[R0]
    load.active_blocks = 7  # as a reported number, not what the request above reserved
    prompt = tokens(50)
    prime(router, R0, prompt[:16])
    ctx = context(router, prompt)
    assert ctx.cached_tokens(R0) == 16
    expected = 2.0 * (100 + 50 - 16) / 16 + (7 + 4)
    assert router.policy.logit(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]


def test_kv_cost_equal_costs_go_to_the_smaller_tree_on_every_seed() -> None:
    for seed in SEEDS:
        router = make_router("kv_cost", n=2, seed=seed)
        prime(router, R0, tokens(40, start=500_000))  # unrelated blocks: R0's tree is larger
        prime(router, R1, tokens(20, start=600_000))
        assert route(router, tokens(64)).replica == R1


def test_kv_cost_temperature_samples_the_softmax_of_normalised_logits() -> None:
    # Two replicas whose logits differ by a lot. Normalised by the range, the
    # costlier one's weight is exp(-1 / T): at T = 1, e^-1 / (1 + e^-1) = 27% of the picks; at
    # T = 10, 47.5%; at T = 0.05, essentially never.
    def share_of_costly(temperature: float) -> float:
        picks = []
        for seed in range(400):
            router = make_router("kv_cost", n=2, seed=seed, temperature=temperature)
            busy(router, R0, prompt=16_000)  # R0's logit is about the range itself
            busy(router, R1, prompt=32_000)  # R1: twice R0's
            picks.append(route(router, tokens(64)).replica)
        return picks.count(R1) / len(picks)

    assert 0.20 < share_of_costly(1.0) < 0.34
    assert 0.40 < share_of_costly(10.0) < 0.55
    assert share_of_costly(0.05) == 0.0


def test_kv_cost_temperature_below_one_still_samples() -> None:
    # Any temperature above 0 samples; nearly equal costs then go either way.
    picks = set()
    for seed in SEEDS:
        router = make_router("kv_cost", n=2, seed=seed, temperature=0.5)
        busy(router, R1, prompt=16)  # one block more
        busy(router, R0, prompt=0)
        picks.add(route(router, tokens(64)).replica)
    assert picks == {R0, R1}


@pytest.mark.parametrize(
    ("policy", "field", "bad", "good", "message"),
    [
        ("kv_cost", "block_size", 0, 1, "block_size must be >= 1 and temperature >= 0"),
        ("kv_cost", "temperature", -0.1, 0.0, "block_size must be >= 1 and temperature >= 0"),
        ("consistent_hash", "virtual_nodes", 0, 1, "virtual_nodes must be at least 1"),
    ],
)
def test_config_bounds(policy: str, field: str, bad: float, good: float, message: str) -> None:
    make_policy(policy, **{field: good})
    with pytest.raises(ConfigError) as info:
        make_policy(policy, **{field: bad})
    assert str(info.value) == message


# --- cache_aware: SGLang's rule (its module docstring) ----------------------------------------


def cache_aware_router(loads: Sequence[int], **params: Any) -> Router:
    router = make_router("cache_aware", **params)
    for r, n in zip(NAMES, loads, strict=True):
        busy(router, r, n)
    return router


@pytest.mark.parametrize(
    ("loads", "imbalanced"),
    [
        ((60, 10, 10, 10), False),  # max > 1.5 min but the gap is only 50
        ((195, 130, 130, 130), False),  # gap 65 > 64, but 195 is exactly 1.5 x 130: not more
        ((196, 130, 130, 130), True),  # both: balance wins
    ],
)
def test_cache_aware_imbalance_needs_both_the_gap_and_the_ratio(
    loads: tuple[int, ...], imbalanced: bool
) -> None:
    router = cache_aware_router(loads)
    prompt = tokens(100)
    prime(router, R0, prompt)  # the busiest replica holds the whole prompt
    d = route(router, prompt)
    if imbalanced:
        assert d.reason is DecisionReason.LOAD_IMBALANCE and d.replica != R0
    else:
        assert (d.replica, d.reason) == (R0, DecisionReason.PREFIX_MATCH)


def test_cache_aware_match_rate_counts_tokens_not_blocks() -> None:
    # Block size 4: 3 matched blocks are 12 of a 30-token prompt, a rate of 0.4 > 0.3.
    router = router_over("cache_aware", NAMES, block_size=4)
    prompt = tokens(30)
    prime(router, R2, prompt[:12])
    prime(router, R0, tokens(4, start=900_000))  # trees: R1 and R3 are the smallest
    d = route(router, prompt)
    assert (d.replica, d.reason) == (R2, DecisionReason.PREFIX_MATCH)


def test_cache_aware_follows_a_one_block_match_above_the_rate() -> None:
    router = make_router("cache_aware")
    prompt = tokens(2)
    prime(router, R3, prompt[:1])  # 1 of 2 tokens: 0.5 > 0.3
    prime(router, R0, tokens(1, start=900_000))
    d = route(router, prompt)
    assert (d.replica, d.reason) == (R3, DecisionReason.PREFIX_MATCH)


# --- prefix_affinity: Ray's rule (its module docstring) ---------------------------------------


def test_prefix_affinity_imbalance_is_the_gap_not_the_sum() -> None:
    # Threshold 10: queues 8/5/5/5 sum past 10 but differ by 3: still affinity.
    for seed in SEEDS:
        router = make_router("prefix_affinity", seed=seed, imbalanced_threshold=10.0)
        for r, n in zip(NAMES, (8, 5, 5, 5), strict=True):
            busy(router, r, n)
        prompt = tokens(100)
        prime(router, R0, prompt)
        d = route(router, prompt)
        assert (d.replica, d.reason) == (R0, DecisionReason.PREFIX_MATCH)


def test_prefix_affinity_imbalanced_picks_the_shorter_of_two_random_candidates() -> None:
    # Queues 0/1/2/30, threshold 10: two random candidates, the shorter queue wins. R3 never
    # wins; R2 wins exactly when it is drawn with R3 (1 pair in 6), so over 120 seeds all three
    # others win at some point. (Drawing three would never let R2 win.)
    picks = set()
    for seed in range(120):
        router = make_router("prefix_affinity", seed=seed, imbalanced_threshold=10.0)
        for r, n in zip(NAMES, (0, 1, 2, 30), strict=True):
            busy(router, r, n)
        d = route(router, tokens(100))
        assert d.reason is DecisionReason.LOAD_IMBALANCE
        picks.add(d.replica)
    assert picks == {R0, R1, R2}


def test_prefix_affinity_follows_a_one_block_match_at_the_rate() -> None:
    router = make_router("prefix_affinity")
    prompt = tokens(10)
    prime(router, R3, prompt[:1])  # 1 of 10 tokens: exactly the 0.1 threshold
    prime(router, R0, tokens(1, start=900_000))
    d = route(router, prompt)
    assert (d.replica, d.reason) == (R3, DecisionReason.PREFIX_MATCH)


def test_prefix_affinity_without_any_match_takes_the_smallest_tree_even_at_rate_zero() -> None:
    # match_rate_threshold 0: a miss is still a miss (no replica matched anything), so the set
    # is the smallest trees, and the lowest queue among them wins.
    router = make_router("prefix_affinity", match_rate_threshold=0.0)
    for i, r in enumerate((R0, R1, R2)):
        prime(router, r, tokens(10, start=900_000 + 100 * i))
    busy(router, R0, 0)
    busy(router, R3, 3)  # the only empty tree, and the longest queue
    d = route(router, tokens(10))
    assert (d.replica, d.reason) == (R3, DecisionReason.WEAK_MATCH)


# --- weighted_scorer: llm-d's default profile (README table) ----------------------------------


@pytest.mark.parametrize(
    ("queues", "kv_usage", "cached", "winner"),
    [
        # R0: the shortest queue (2 x 1) and a full cache (2 x 0) = 2.0
        # R1: the longest queue (0), an empty cache (2 x 1), nothing cached (0) = 2.0
        # R2: the longest queue (0), half-full cache (2 x 0.5), half the prompt cached
        # (3 x 0.5) = 2.5
        ({R1: 4, R2: 4}, (1.0, 0.0, 0.5), (R2, 5), R2),
        # Queues scale between the shortest (1) and the longest (0): R0 at 2 of (1..5) scores
        # 0.75. R0: 2 x 0.75 + 2 x 1 = 3.5; R1: 2 x 1 + 2 x 0.2 + 3 x 0.3 = 3.3 -> R0.
        ({R0: 2, R1: 1, R2: 5}, (0.0, 0.8, 0.0), (R1, 3), R0),
        # Queues 2..6: R0 at 3 scores 0.75, R1 at 2 scores 1. R0: 1.5 + 2 = 3.5;
        # R1: 2 + 2 x 0.2 + 3 x 0.4 = 3.6 -> R1 (scaled by the range 4, not by the sum 8).
        ({R0: 3, R1: 2, R2: 6}, (0.0, 0.8, 0.0), (R1, 4), R1),
    ],
    ids=["prefix-wins", "queue-wins", "range-not-sum"],
)
def test_weighted_scorer_score_is_2_queue_plus_2_free_kv_plus_3_prefix(
    queues: dict[ReplicaId, int],
    kv_usage: tuple[float, float, float],
    cached: tuple[ReplicaId, int],
    winner: ReplicaId,
) -> None:
    for seed in SEEDS:  # the same winner on every seed
        router = make_router("weighted_scorer", n=3, seed=seed)
        prompt = tokens(10)
        busy_each(router, queues)
        for replica, usage in zip((R0, R1, R2), kv_usage, strict=True):
            router.loads.observe(replica, kv_usage=usage)
        prime(router, cached[0], prompt[: cached[1]])
        assert route(router, prompt).replica == winner


def test_weighted_scorer_empty_prompt_has_no_prefix_score() -> None:
    # Equal queues; R1's cache is half full: R0 wins on free KV alone, whatever the seed.
    for seed in SEEDS:
        router = make_router("weighted_scorer", n=2, seed=seed)
        router.loads.observe(R0, kv_usage=0.0)
        router.loads.observe(R1, kv_usage=0.5)
        assert route(router, []).replica == R0


# --- consistent_hash ---------------------------------------------------------------------------


def test_consistent_hash_keys_on_the_first_block_without_a_session() -> None:
    # Prompts that share their first block (token) but nothing after it stick together.
    router = make_router("consistent_hash")
    for first in range(20):
        homes = {route(router, [first, 1000 + i, 2000 + i]).replica for i in range(5)}
        assert len(homes) == 1


def test_consistent_hash_keys_a_request_with_no_session_or_block_on_its_id() -> None:
    # An empty prompt (or one shorter than a block) has nothing else to key on: its id spreads
    # such requests like any hash, and the same id always lands in the same place.
    router = make_router("consistent_hash")
    homes = [router.route(router.view(f"short-{i}", tokens=[]), 0.0).replica for i in range(40)]
    assert len(set(homes)) == len(NAMES)
    again = [router.route(router.view(f"short-{i}", tokens=[]), 0.0).replica for i in range(40)]
    assert again == homes


# --- the shortlist (RoutingContext.shortlist's docstring) --------------------------------------

SHORT = (64, 16, 16)  # predicted_ttft's defaults: above, top, sample


def big(n: int) -> tuple[Router, list[ReplicaId]]:
    names = [ReplicaId(f"b{i:03}") for i in range(n)]
    return router_over("predicted_ttft", names), names


def test_shortlist_starts_above_the_threshold_not_at_it() -> None:
    router, names = big(100)  # more than 64 replicas registered: the holder map is on
    assert router.index.has_holder_map
    ctx = context(router, tokens(8), names[:64])
    assert ctx.shortlist(*SHORT) is ctx
    ctx = context(router, tokens(8), names[:65])
    narrowed = ctx.shortlist(*SHORT)
    assert narrowed is not ctx and len(narrowed.candidates) == 16


def test_no_shortlist_without_the_holder_map_or_with_speculative_entries() -> None:
    router, _ = big(10)  # few replicas registered: no holder map
    assert not router.index.has_holder_map
    many = [ReplicaId(f"x{i}") for i in range(100)]
    ctx = context(router, tokens(8), many)
    assert ctx.shortlist(*SHORT) is ctx
    from prefixroute.core.speculative import SpeculativeEntries

    router, names = big(100)
    ctx = context(router, tokens(8), names)
    ctx.speculative = SpeculativeEntries(ttl_s=1.0)
    assert ctx.shortlist(*SHORT) is ctx


def test_shortlist_adds_gapped_candidates_with_exact_matches_and_keeps_the_context() -> None:
    # Replicas the holder map cannot see (engine events removed a block of theirs) are always
    # scored, with their exact match; a gapped replica that is not a candidate is not.
    router, names = big(200)
    prompt = tokens(100)
    gapped_in, gapped_out = names[7], names[8]
    for r in (gapped_in, gapped_out):
        prime(router, r, prompt[:60])
        router.index.remove_blocks(r, router.hasher.hash_tokens(prompt[:60])[59:])  # -> 59
    assert router.index.gapped_replicas == {gapped_in, gapped_out}
    home = names[150]
    prime(router, home, prompt[:30])
    cands = [r for r in names if r != gapped_out]
    ctx = context(router, prompt, cands)
    narrowed = ctx.shortlist(*SHORT)
    matches = narrowed.matches
    assert gapped_in in narrowed.candidates and gapped_out not in narrowed.candidates
    assert matches[gapped_in] == 59 and matches[home] == 30
    assert all(m == 0 for r, m in matches.items() if r not in (gapped_in, home))
    assert list(narrowed.candidates) == sorted(narrowed.candidates)
    assert (narrowed.request, narrowed.index, narrowed.loads, narrowed.rng, narrowed.now) == (
        ctx.request, ctx.index, ctx.loads, ctx.rng, ctx.now,
    )  # fmt: skip
    assert router.route(router.view("q", tokens=prompt), 0.0, cands).replica == gapped_in


# --- the registry's error messages (README: an unknown name lists the valid ones) ---------------


def test_unknown_policy_message_lists_every_valid_name() -> None:
    from prefixroute.core import UnknownPolicy, parse_policy_list, policy_names

    valid = ", ".join(policy_names())
    for call in (lambda: make_policy("fastest"), lambda: parse_policy_list("round_robin,fastest")):
        with pytest.raises(UnknownPolicy) as info:
            call()
        assert str(info.value) == f"unknown policy 'fastest'; valid: {valid}"
    with pytest.raises(ConfigError) as no_name:
        parse_policy_list(" , ")
    assert str(no_name.value) == "no policy given"


def test_unknown_parameter_message_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        make_policy("kv_cost", overlap=1.0, temp=2.0)
    assert str(info.value).startswith(
        "policy 'kv_cost' has no parameter overlap, temp; valid: block_size, overlap_weight, "
        "temperature"
    )
    with pytest.raises(ConfigError) as none:
        make_policy("round_robin", start=2)
    assert str(none.value).endswith("valid: none")


# --- the load view's recent arrivals (core/load.py: "exponentially decayed", 10 s window) ----


def test_arrival_rate_and_mean_uncached_decay_over_ten_seconds() -> None:
    import math

    router = make_router("predicted_ttft")
    for now, prompt in ((0.0, 100), (10.0, 300), (20.0, 500)):
        dispatch(router, R0, prompt, now)
    load = router.loads[R0]
    e = math.exp(-1.0)  # each arrival is one window older than the next
    count = (1 * e + 1) * e + 1
    assert load.arrival_rate(20.0) == pytest.approx(count / 10)
    assert load.arrival_rate(30.0) == pytest.approx(count * e / 10)
    assert load.mean_uncached() == pytest.approx(((100 * e + 300) * e + 500) / count)
    assert router.loads[R1].mean_uncached() == 0.0 and router.loads[R1].arrival_rate(5.0) == 0.0


def test_ttft_adds_the_replica_s_learned_first_token_overhead() -> None:
    """The docstring's last term: a replica's fixed first-token cost, where the speed model
    learned one (a gateway), is part of its predicted TTFT; with ``learned_speeds`` off the
    fixed constants know no overhead."""
    for learned, expected in ((True, 1000 / RATE + 0.05), (False, 1000 / RATE)):
        router = make_router("predicted_ttft", learned_speeds=learned)
        router.replica_load(R0).speed.first_token_overhead_s = 0.05  # as if learned
        ctx = context(router, tokens(1000))
        assert router.policy.predict(ctx, R0) == pytest.approx(expected)  # type: ignore[attr-defined]
        assert router.policy.predict(ctx, R1) == pytest.approx(1000 / RATE)  # type: ignore[attr-defined]
