"""Tests for prefixroute.core.policies: each policy's documented behaviour and the registry.

Every test drives a real :class:`Router` (block size 1, so a token is a block) over replicas
r0..r3. Load is set through the one bookkeeping path (``router.loads.dispatch`` and friends) and
cache contents through ``router.index.insert``; ``route`` below also checks on every decision that
the predicted cached tokens are the matched blocks capped at ``prompt - 1``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixroute.core import (
    DEFAULT_POLICY,
    POLICIES,
    BlockHasher,
    ConfigError,
    Decision,
    DecisionReason,
    ReplicaId,
    Router,
    RoutingContext,
    UnknownPolicy,
    make_policy,
    parse_policy_list,
    policy_names,
)

from .helpers import NAMES, R0, R1, R2, R3, arrivals, busy, busy_each, make_router, prime, tokens

R4 = ReplicaId("r4")
FILLER = 1_000_000  # token ids from here on never occur in prompts
_ids = itertools.count()


def route(
    router: Router,
    toks: Sequence[int],
    *,
    session: str | None = None,
    candidates: Sequence[ReplicaId] | None = None,
    rid: str | None = None,
) -> Decision:
    """Route a prompt and check the decision's predicted cached tokens."""
    view = router.view(rid or f"q{next(_ids)}", tokens=toks, session_id=session)
    before = router.index.match(view.block_hashes)
    decision = router.route(view, 0.0, candidates)
    assert decision.replica in (router.replicas if candidates is None else candidates)
    expected = min(before.get(decision.replica, 0), max(0, len(toks) - 1))
    assert decision.predicted_cached_tokens == expected
    return decision


def trees(router: Router, sizes: dict[ReplicaId, int]) -> None:
    """Give replicas unrelated cached blocks, so their tree sizes differ."""
    for i, (r, n) in enumerate(sizes.items()):
        prime(router, r, tokens(n, FILLER + 10_000 * i))


# --- round_robin ------------------------------------------------------------------------------


def test_round_robin_cycles_through_replicas() -> None:
    router = make_router("round_robin")
    picks = [route(router, tokens(10)).replica for _ in range(9)]
    assert picks == [R0, R1, R2, R3, R0, R1, R2, R3, R0]
    assert {route(router, tokens(10)).reason for _ in range(4)} == {DecisionReason.ROUND_ROBIN}


def test_round_robin_ignores_cache_and_load() -> None:
    router = make_router("round_robin")
    prime(router, R3, tokens(50))
    busy(router, R0, 20)
    assert [route(router, tokens(50)).replica for _ in range(4)] == NAMES


# --- random -----------------------------------------------------------------------------------


def test_random_is_seeded_and_deterministic() -> None:
    def picks(seed: int) -> list[ReplicaId]:
        router = make_router("random", seed=seed)
        return [route(router, tokens(5)).replica for _ in range(40)]

    assert picks(7) == picks(7)
    assert picks(7) != picks(8)
    assert set(picks(7)) == set(NAMES)
    router = make_router("random")
    assert route(router, tokens(5)).reason is DecisionReason.RANDOM


# --- least_loaded -----------------------------------------------------------------------------


def test_least_loaded_picks_fewest_in_flight() -> None:
    router = make_router("least_loaded")
    for r, n in zip(NAMES, (3, 1, 2, 0), strict=True):
        busy(router, r, n)
    prime(router, R0, tokens(50))  # cache is ignored
    d = route(router, tokens(50))
    assert (d.replica, d.reason) == (R3, DecisionReason.LEAST_LOADED)


def test_least_loaded_breaks_ties_on_queued_prefill() -> None:
    router = make_router("least_loaded")
    busy(router, R0, 1, prompt=100)
    busy(router, R1, 1, prompt=10)
    busy(router, R2, 1, prompt=500)
    busy(router, R3, 2)
    assert route(router, tokens(5)).replica == R1


def test_least_loaded_spreads_and_complete_releases() -> None:
    router = make_router("least_loaded")
    picks = [route(router, tokens(5), rid=f"spread{i}") for i in range(8)]
    assert sorted(d.replica for d in picks) == sorted(NAMES * 2)
    assert all(router.loads[r].in_flight == 2 for r in NAMES)
    router.complete("spread7", 1.0)
    assert route(router, tokens(5)).replica == picks[-1].replica


# --- power_of_two -----------------------------------------------------------------------------


class RecordingRandom(random.Random):
    """A seeded Random that remembers every pair it samples (a fake, not a patch)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.samples: list[list[Any]] = []

    def sample(self, population: Any, k: int, *, counts: Any = None) -> list[Any]:
        out = super().sample(population, k, counts=counts)
        self.samples.append(out)
        return out


def test_power_of_two_never_picks_the_more_loaded_of_its_pair() -> None:
    router = make_router("power_of_two")
    rng = RecordingRandom(3)
    router.rng = rng
    for r, n in zip(NAMES, (0, 2, 4, 6), strict=True):
        busy(router, r, n)
    for _ in range(200):
        in_flight = {r: router.loads[r].in_flight for r in NAMES}
        d = route(router, tokens(5))
        a, b = rng.samples[-1]
        assert d.replica in (a, b)
        other = b if d.replica == a else a
        assert in_flight[d.replica] <= in_flight[other]
        if in_flight[a] == in_flight[b]:
            assert d.replica == a  # ties keep the first sampled
        assert d.reason is DecisionReason.POWER_OF_TWO


@pytest.mark.parametrize("seed", range(30))
def test_power_of_two_never_picks_the_single_most_loaded(seed: int) -> None:
    router = make_router("power_of_two", seed=seed)
    for r, n in zip(NAMES, (1, 0, 5, 2), strict=True):
        busy(router, r, n)
    assert route(router, tokens(5)).replica != R2


# --- consistent_hash --------------------------------------------------------------------------


def test_consistent_hash_keeps_a_session_on_one_replica() -> None:
    router = make_router("consistent_hash")
    first = {s: route(router, tokens(20), session=f"s{s}").replica for s in range(50)}
    busy(router, R0, 30)  # load does not move sessions
    for turn in range(1, 4):
        for s, r in first.items():
            d = route(router, tokens(20 + turn * 7, start=s * 100), session=f"s{s}")
            assert (d.replica, d.reason) == (r, DecisionReason.SESSION_HASH)
    assert len(set(first.values())) == 4  # 50 sessions land on every replica


def test_consistent_hash_without_session_uses_first_block() -> None:
    router = make_router("consistent_hash")
    homes = {route(router, [42, *tokens(n)]).replica for n in range(1, 30)}
    assert len(homes) == 1


def test_consistent_hash_moves_about_one_in_n_sessions_when_a_replica_joins() -> None:
    router = make_router("consistent_hash")
    sessions = [f"session-{i}" for i in range(2000)]
    before = {s: route(router, tokens(8), session=s).replica for s in sessions}
    router.add_replica(R4)
    after = {s: route(router, tokens(8), session=s).replica for s in sessions}
    moved = [s for s in sessions if before[s] != after[s]]
    assert all(after[s] == R4 for s in moved), "a session moved between two old replicas"
    assert 0.1 < len(moved) / len(sessions) < 0.3  # ideal 1/5
    router.remove_replica(R4)
    again = {s: route(router, tokens(8), session=s).replica for s in sessions}
    assert again == before  # removing it restores the old homes exactly


# --- prefix_affinity (Ray Serve) --------------------------------------------------------------

PROMPT = tokens(100)


def test_prefix_affinity_at_match_threshold_goes_to_best_match() -> None:
    router = make_router("prefix_affinity")
    trees(router, {R0: 5, R1: 3, R2: 50, R3: 8})
    prime(router, R2, PROMPT[:10])  # 10/100 = 0.1: at the threshold counts as a hit
    d = route(router, PROMPT)
    assert (d.replica, d.reason, d.predicted_cached_tokens) == (R2, DecisionReason.PREFIX_MATCH, 10)


def test_prefix_affinity_below_match_threshold_goes_to_smallest_tree() -> None:
    router = make_router("prefix_affinity")
    trees(router, {R0: 5, R1: 3, R2: 50, R3: 8})
    prime(router, R2, PROMPT[:9])  # 0.09 < 0.1
    d = route(router, PROMPT)
    assert (d.replica, d.reason) == (R1, DecisionReason.WEAK_MATCH)


def test_prefix_affinity_best_match_ties_go_to_lowest_queue_then_candidate_order() -> None:
    router = make_router("prefix_affinity")
    for r in (R1, R2, R3):
        prime(router, r, PROMPT[:60])
    busy_each(router, {R1: 2, R2: 1, R3: 1})
    assert route(router, PROMPT).replica == R2  # R2 and R3 tie on queue: first in order


def test_prefix_affinity_default_never_leaves_the_match_for_load() -> None:
    router = make_router("prefix_affinity")  # Ray 2.60: imbalanced_threshold=inf
    prime(router, R2, PROMPT)
    busy(router, R2, 1_000)
    d = route(router, PROMPT)
    assert (d.replica, d.reason) == (R2, DecisionReason.PREFIX_MATCH)


def test_prefix_affinity_imbalance_of_exactly_threshold_keeps_affinity() -> None:
    router = make_router("prefix_affinity", imbalanced_threshold=10)
    prime(router, R2, PROMPT)
    busy(router, R2, 10)
    d = route(router, PROMPT)
    assert (d.replica, d.reason) == (R2, DecisionReason.PREFIX_MATCH)


@pytest.mark.parametrize("seed", range(20))
def test_prefix_affinity_imbalance_above_threshold_disables_affinity(seed: int) -> None:
    router = make_router("prefix_affinity", seed=seed, imbalanced_threshold=10)
    prime(router, R2, PROMPT)
    busy(router, R2, 11)  # 11 - 0 > 10
    d = route(router, PROMPT)
    assert d.reason is DecisionReason.LOAD_IMBALANCE
    assert d.replica != R2  # the pair's shorter queue is never the overloaded one


def test_prefix_affinity_threshold_parameters() -> None:
    router = make_router("prefix_affinity", imbalanced_threshold=2, match_rate_threshold=0.5)
    trees(router, {R0: 1, R1: 9, R2: 9, R3: 9})
    prime(router, R2, PROMPT[:49])
    assert route(router, PROMPT).reason is DecisionReason.WEAK_MATCH
    busy(router, R1, 3)
    assert route(router, PROMPT).reason is DecisionReason.LOAD_IMBALANCE


# --- cache_aware (SGLang) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hot", "others", "imbalanced"),
    [
        (64, 0, False),  # abs diff 64 is not > 64
        (65, 0, True),  # diff 65 > 64 and 65 > 0 * 1.5
        (200, 135, False),  # diff 65 > 64 but 200 <= 135 * 1.5 = 202.5
        (203, 135, True),  # diff 68 > 64 and 203 > 202.5
    ],
)
def test_cache_aware_imbalance_needs_both_thresholds(
    hot: int, others: int, imbalanced: bool
) -> None:
    router = make_router("cache_aware")
    prime(router, R0, PROMPT)
    busy(router, R0, hot)
    busy(router, R1, others + 1)
    busy(router, R2, others)
    busy(router, R3, others + 1)
    d = route(router, PROMPT)
    if imbalanced:
        assert (d.replica, d.reason) == (R2, DecisionReason.LOAD_IMBALANCE)
    else:
        assert (d.replica, d.reason) == (R0, DecisionReason.PREFIX_MATCH)


@pytest.mark.parametrize(("matched", "hit"), [(30, False), (31, True), (100, True)])
def test_cache_aware_match_rate_must_exceed_threshold(matched: int, hit: bool) -> None:
    router = make_router("cache_aware")
    trees(router, {R0: 5, R1: 3, R2: 50, R3: 8})
    prime(router, R2, PROMPT[:matched])
    d = route(router, PROMPT)
    if hit:
        assert (d.replica, d.reason) == (R2, DecisionReason.PREFIX_MATCH)
    else:
        assert (d.replica, d.reason) == (R1, DecisionReason.WEAK_MATCH)  # smallest tree


def test_cache_aware_equal_longest_matches_go_to_least_loaded() -> None:
    router = make_router("cache_aware")
    for r in (R0, R1, R3):
        prime(router, r, PROMPT[:80])
    busy_each(router, {R0: 3, R1: 1, R3: 2})
    assert route(router, PROMPT).replica == R1


# --- weighted_scorer (llm-d) ------------------------------------------------------------------

SHORT = tokens(30)


def test_weighted_scorer_prefix_decides_when_load_is_equal() -> None:
    router = make_router("weighted_scorer")
    prime(router, R1, SHORT[:15])
    prime(router, R3, SHORT)
    d = route(router, SHORT)
    assert (d.replica, d.reason) == (R3, DecisionReason.BEST_SCORE)


@pytest.mark.parametrize("source", ["scraped", "router"])
@pytest.mark.parametrize(("matched", "winner"), [(18, R1), (21, R0), (30, R0)])
def test_weighted_scorer_queue_weight_2_against_prefix_weight_3(
    source: str, matched: int, winner: ReplicaId
) -> None:
    # R0 has the longest queue (queue score 0) and a prefix match; R1 the shortest (score 1):
    # R0 scores 2*0 + 2 + 3*matched/30 against R1's 2*1 + 2 + 0 = 4, so R0 needs matched > 20.
    router = make_router("weighted_scorer")
    queues = {R0: 4, R1: 0, R2: 2, R3: 2}
    for r, q in queues.items():
        if source == "scraped":
            router.loads.observe(r, num_waiting=q)
        else:
            busy(router, r, q)  # before any scrape the router's own prefilling count is used
    prime(router, R0, SHORT[:matched])
    assert route(router, SHORT).replica == winner


@pytest.mark.parametrize(("usage", "winner"), [(0.9, R2), (0.7, R0)])
def test_weighted_scorer_kv_weight_2_against_prefix_weight_3(
    usage: float, winner: ReplicaId
) -> None:
    # R0: 2 + 2*(1 - usage) + 3*0.5; R2: 2 + 2*1 + 0 = 4; R1, R3: 2 + 2*0.5 = 3.
    router = make_router("weighted_scorer")
    for r, u in {R0: usage, R1: 0.5, R2: 0.0, R3: 0.5}.items():
        router.loads.observe(r, kv_usage=u)
    prime(router, R0, SHORT[:15])
    assert route(router, SHORT).replica == winner


def test_weighted_scorer_weights_are_parameters() -> None:
    router = make_router("weighted_scorer", prefix_weight=0.0)
    for r, q in {R0: 0, R1: 5, R2: 5, R3: 5}.items():
        router.loads.observe(r, num_waiting=q)
    prime(router, R1, SHORT)
    assert route(router, SHORT).replica == R0


# --- kv_cost (Dynamo) -------------------------------------------------------------------------

LONG = tokens(320)


def kv_cost_router(overlap_weight: float) -> Router:
    # R0 caches 319 of 320 prompt tokens but holds 10 active KV blocks of another request.
    router = make_router("kv_cost", overlap_weight=overlap_weight)
    prime(router, R0, LONG)
    busy(router, R0, prompt=160, prefilled=True)
    assert router.loads[R0].active_blocks == 10
    return router


@pytest.mark.parametrize(
    ("overlap_weight", "cached_wins"), [(1.0, True), (0.6, True), (0.4, False), (0.0, False)]
)
def test_kv_cost_overlap_weight_trades_prefill_against_decode(
    overlap_weight: float, cached_wins: bool
) -> None:
    # logit(R0) = w * 1/16 + 10 + 20;  logit(others) = w * 320/16 + 0 + 20: break-even w ~ 0.5.
    router = kv_cost_router(overlap_weight)
    d = route(router, LONG)
    assert d.reason is DecisionReason.LOWEST_COST
    assert (d.replica == R0) is cached_wins


def test_kv_cost_lower_logit_wins() -> None:
    router = kv_cost_router(1.0)
    policy = router.policy
    assert hasattr(policy, "logit")
    busy(router, R1, prompt=700)
    busy(router, R2, prompt=100, prefilled=True)
    view = router.view("probe", tokens=LONG)
    ctx = RoutingContext(view, router.replicas, router.index, router.loads, router.rng, 0.0)
    logits = {r: policy.logit(ctx, r) for r in router.replicas}
    assert logits[R0] == pytest.approx(1 / 16 + 10 + 20)
    assert logits[R1] == pytest.approx((700 + 320) / 16 + 44 + 20)  # 44 = ceil(700 / 16)
    d = router.route(view, 0.0)
    assert logits[d.replica] == min(logits.values())


def test_kv_cost_ties_go_to_the_smaller_tree() -> None:
    router = make_router("kv_cost")
    busy(router, R0, prompt=5000)
    busy(router, R3, prompt=5000)
    trees(router, {R1: 7, R2: 2})
    assert route(router, tokens(64)).replica == R2


def test_kv_cost_temperature_samples_deterministically_per_seed() -> None:
    def picks(seed: int) -> list[ReplicaId]:
        router = make_router("kv_cost", seed=seed, temperature=1.0)
        return [route(router, tokens(64, start=100 * i)).replica for i in range(30)]

    assert picks(1) == picks(1)
    assert len(set(picks(1))) > 1


# --- predicted_ttft (default) -----------------------------------------------------------------

TURN = tokens(1000)


@pytest.mark.parametrize("queued", [0, 500])
def test_predicted_ttft_follows_cached_prefix_when_queues_are_equal(queued: int) -> None:
    router = make_router("predicted_ttft")
    for r in NAMES:
        busy(router, r, prompt=queued)
    prime(router, R2, TURN)
    d = route(router, TURN)
    assert (d.replica, d.reason, d.predicted_cached_tokens) == (
        R2,
        DecisionReason.PREFIX_MATCH,
        999,
    )


def miss_penalty(policy: str = "predicted_ttft") -> float:
    """The extra weight predicted_ttft puts on uncached tokens (0 if it has no such knob)."""
    config = POLICIES[policy][1]()
    return float(getattr(config, "miss_penalty", 0.0))


def pure_ttft() -> dict[str, Any]:
    """Parameters that make predicted_ttft score plain predicted TTFT (no extra penalties)."""
    fields = {f.name for f in dataclasses.fields(POLICIES["predicted_ttft"][1])}
    knobs = ("miss_penalty", "interference", "arrivals")
    return {knob: 0.0 for knob in knobs if knob in fields}


@pytest.mark.parametrize(("queued", "stays"), [(900, True), (1100, False), (5000, False)])
def test_predicted_ttft_yields_when_queue_exceeds_the_saving(queued: int, stays: bool) -> None:
    # R2 would save 999 tokens of prefill but has ``queued`` tokens of prefill ahead of us.
    router = make_router("predicted_ttft", **pure_ttft())
    prime(router, R2, TURN)
    busy(router, R2, prompt=queued)
    d = route(router, TURN)
    if stays:
        assert (d.replica, d.reason) == (R2, DecisionReason.PREFIX_MATCH)
    else:
        assert d.replica != R2
        assert d.reason is DecisionReason.HOT_SPOT_YIELD
        assert d.predicted_cached_tokens == 0


@pytest.mark.parametrize(("factor", "stays"), [(0.9, True), (1.1, False)])
def test_predicted_ttft_default_yields_past_the_penalised_saving(
    factor: float, stays: bool
) -> None:
    # The other replicas are idle, so going there costs nobody else anything (no miss
    # penalty on an idle replica): R2 keeps the request until its queue exceeds the saving.
    router = make_router("predicted_ttft")
    prime(router, R2, TURN)
    busy(router, R2, prompt=round(factor * 999))
    d = route(router, TURN)
    assert (d.replica == R2) is stays
    assert d.reason is (DecisionReason.PREFIX_MATCH if stays else DecisionReason.HOT_SPOT_YIELD)


def test_predicted_ttft_picks_an_empty_new_replica_when_others_are_busy() -> None:
    router = make_router("predicted_ttft", n=3)
    first = [route(router, tokens(1000, start=10_000 * i)) for i in range(3)]
    assert {d.replica for d in first} == {R0, R1, R2}  # one prompt each
    assert all(d.reason is DecisionReason.LEAST_LOADED for d in first)
    for r in (R0, R1, R2):
        busy(router, r, prompt=2000)  # 3000 queued prefill tokens each
    router.add_replica(R3)  # cold start: empty cache, empty queue
    fresh = route(router, tokens(1000, start=90_000), rid="fresh")
    assert (fresh.replica, fresh.reason) == (R3, DecisionReason.LEAST_LOADED)
    router.complete("fresh", 1.0)
    # Half of this prompt is cached where the first prompt went, but that replica's queue
    # (3000 tokens) costs more than the half (500 tokens) saves.
    shared = route(router, tokens(500) + tokens(500, start=95_000))
    assert (shared.replica, shared.reason) == (R3, DecisionReason.HOT_SPOT_YIELD)


def test_predicted_ttft_prefers_longest_match_within_tie_tolerance() -> None:
    router = make_router("predicted_ttft", **pure_ttft())
    prime(router, R1, TURN[:5])  # saves 0.0005 s ...
    busy(router, R1, prompt=10)  # ... and waits 0.001 s: within the 0.002 s tolerance
    d = route(router, TURN)
    assert (d.replica, d.reason) == (R1, DecisionReason.PREFIX_MATCH)


def test_predicted_ttft_counts_decode_steps_on_busy_replicas() -> None:
    router = make_router("predicted_ttft", n=2, **pure_ttft())
    prime(router, R0, TURN)
    prime(router, R1, TURN)
    busy(router, R0, prompt=8, prefilled=True)  # R0 is decoding: each step costs 15 ms more
    assert route(router, TURN).replica == R1


def test_predicted_ttft_rejects_bad_rates() -> None:
    with pytest.raises(ConfigError):
        make_policy("predicted_ttft", prefill_tokens_per_s=0)
    with pytest.raises(ConfigError):
        make_policy("predicted_ttft", step_tokens=0)


# Each parameter's range, from its meaning: a fraction of the prompt is 0..1; a weight, a
# threshold, a tolerance or a step time is never negative. Outside it, a value ran without a word
# (``cache_threshold=-5`` followed any match, a negative weight turned a scorer around).
_RANGES = [
    ("cache_aware", "cache_threshold", 0.0, 1.0),
    ("cache_aware", "balance_abs_threshold", 0, None),
    ("cache_aware", "balance_rel_threshold", 0.0, None),
    ("prefix_affinity", "imbalanced_threshold", 0.0, None),
    ("prefix_affinity", "match_rate_threshold", 0.0, 1.0),
    ("weighted_scorer", "queue_weight", 0.0, None),
    ("weighted_scorer", "kv_cache_weight", 0.0, None),
    ("weighted_scorer", "prefix_weight", 0.0, None),
    ("kv_cost", "overlap_weight", 0.0, None),
    ("predicted_ttft", "decode_step_s", 0.0, None),
    ("predicted_ttft", "tie_tolerance_s", 0.0, None),
    ("predicted_ttft", "miss_penalty", 0.0, None),
    ("predicted_ttft", "interference", 0.0, None),
    ("predicted_ttft", "arrivals", 0.0, None),
]


@pytest.mark.parametrize(("policy", "key", "lowest", "highest"), _RANGES)
def test_a_parameter_outside_its_range_is_refused(
    policy: str, key: str, lowest: float, highest: float | None
) -> None:
    assert getattr(make_policy(policy, **{key: lowest}).config, key) == lowest  # ends allowed
    below = lowest - 1 if isinstance(lowest, int) and not isinstance(lowest, float) else -0.01
    with pytest.raises(ConfigError, match=f"parameter {key} must be"):
        make_policy(policy, **{key: below})
    with pytest.raises(ConfigError, match=f"{key} must be"):
        make_policy(policy, **{key: math.nan})  # TOML's nan compared false everywhere
    if highest is None:  # no upper end: infinity is "never" (prefix_affinity's default)
        if not isinstance(lowest, int) or isinstance(lowest, float):
            assert getattr(make_policy(policy, **{key: math.inf}).config, key) == math.inf
        return
    assert getattr(make_policy(policy, **{key: highest}).config, key) == highest
    with pytest.raises(ConfigError, match=f"must be between {lowest:g} and {highest:g}, got 1.01"):
        make_policy(policy, **{key: highest + 0.01})


def test_an_out_of_range_message_names_the_policy_the_key_and_the_value() -> None:
    with pytest.raises(ConfigError) as bad:
        make_policy("weighted_scorer", prefix_weight=-2)
    assert str(bad.value) == (
        "policy 'weighted_scorer': parameter prefix_weight must be at least 0, got -2"
    )


# --- every policy -----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(policy_names()),
    block_size=st.sampled_from([1, 4]),
    seed=st.integers(min_value=0, max_value=1000),
    cached=st.lists(st.integers(min_value=0, max_value=40), min_size=4, max_size=4),
    loads=st.lists(st.integers(min_value=0, max_value=80), min_size=4, max_size=4),
    prompt=st.integers(min_value=0, max_value=40),
)
def test_every_policy_predicts_matched_blocks_capped_below_the_prompt(
    name: str, block_size: int, seed: int, cached: list[int], loads: list[int], prompt: int
) -> None:
    router = Router(make_policy(name), BlockHasher(block_size=block_size), seed=seed)
    toks = tokens(prompt)
    for r, c, n in zip(NAMES, cached, loads, strict=True):
        router.add_replica(r)
        router.index.insert(r, router.hasher.hash_tokens(tokens(c)))
        busy(router, r, n, prompt=c)
    view = router.view("x", tokens=toks)
    match = router.index.match(view.block_hashes)
    d = router.route(view, 0.0)
    assert d.replica in NAMES
    blocks = min(match.get(d.replica, 0), max(0, prompt - 1) // block_size)
    assert d.predicted_cached_tokens == blocks * block_size
    assert d.predicted_cached_tokens <= max(0, prompt - 1)
    assert d.reason in DecisionReason


# --- registry ---------------------------------------------------------------------------------

EXPECTED = {
    "round_robin",
    "random",
    "least_loaded",
    "power_of_two",
    "consistent_hash",
    "prefix_affinity",
    "cache_aware",
    "weighted_scorer",
    "kv_cost",
    "predicted_ttft",
}


def test_registry_holds_the_ten_policies_under_their_own_names() -> None:
    assert set(policy_names()) == EXPECTED
    assert DEFAULT_POLICY == "predicted_ttft"
    for name, (cls, config_cls) in POLICIES.items():
        assert cls.name == name
        policy = make_policy(name)
        assert isinstance(policy, cls)
        config = getattr(policy, "config", None)
        assert isinstance(config, config_cls)
        assert dataclasses.is_dataclass(config)
        for f in dataclasses.fields(config):
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(config, f.name, getattr(config, f.name))


def test_make_policy_returns_fresh_instances() -> None:
    assert make_policy("round_robin") is not make_policy("round_robin")


def test_make_policy_overrides_config_fields() -> None:
    policy = make_policy("kv_cost", overlap_weight=2.5)
    assert policy.config.overlap_weight == 2.5  # type: ignore[attr-defined]


def test_make_policy_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UnknownPolicy) as info:
        make_policy("fastest")
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert "fastest" in message
    for name in EXPECTED:
        assert name in message


@pytest.mark.parametrize(
    ("name", "params"),
    [("kv_cost", {"overlap": 1.0}), ("round_robin", {"start": 2}), ("cache_aware", {"x": 1})],
)
def test_make_policy_unknown_parameter_raises_config_error(
    name: str, params: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match=next(iter(params))) as info:
        make_policy(name, **params)
    assert not isinstance(info.value, UnknownPolicy)


def test_parse_policy_list() -> None:
    assert parse_policy_list("round_robin") == ["round_robin"]
    assert parse_policy_list(" kv_cost , predicted_ttft,") == ["kv_cost", "predicted_ttft"]
    with pytest.raises(ConfigError):
        parse_policy_list(" , ")
    with pytest.raises(UnknownPolicy, match="nope"):
        parse_policy_list("round_robin,nope")


@pytest.mark.parametrize("spec", ["round_robin,,predicted_ttft", "round_robin, ,kv_cost"])
def test_parse_policy_list_refuses_an_empty_name_between_two(spec: str) -> None:
    """``a,,b`` is most likely a name left out: refused, not read as ``a,b``."""
    with pytest.raises(ConfigError, match="an empty policy name"):
        parse_policy_list(spec)


def test_parse_policy_list_refuses_a_policy_named_twice() -> None:
    """It ran twice and was reported twice under one name: refused, naming it."""
    spec = "round_robin,kv_cost, round_robin,random,kv_cost"
    with pytest.raises(ConfigError) as info:
        parse_policy_list(spec)
    assert str(info.value) == f"a policy named twice in {spec!r}: kv_cost, round_robin"
    assert parse_policy_list("round_robin,kv_cost") == ["round_robin", "kv_cost"]


@pytest.mark.parametrize("spec", ["kv_costX", "Xround_robin,", ",random_"])
def test_parse_policy_list_drops_only_commas_and_spaces_at_the_ends(spec: str) -> None:
    """Each name is checked as written: only the list's own separators are forgiven."""
    with pytest.raises(UnknownPolicy):
        parse_policy_list(spec)


def test_predicted_ttft_sends_a_long_cold_prompt_where_fewer_requests_arrive() -> None:
    # Equal queues (one decoding request each), but R0 has received many short requests
    # lately: their chunks would ride along in the later steps of a 5,000-token prefill.
    router = make_router("predicted_ttft", n=2)
    busy(router, R0, prompt=100, prefilled=True)
    busy(router, R1, prompt=100, prefilled=True)
    arrivals(router, R0, 20, 200)  # recent arrivals on R0, already finished
    d = route(router, tokens(5_000, start=70_000))
    assert d.replica == R1


# --- predicted_ttft on large clusters: the shortlist ------------------------------------------
def big_router(n: int, **params: Any) -> tuple[Router, list[ReplicaId]]:
    router = Router(make_policy("predicted_ttft", **params), BlockHasher(block_size=1))
    names = [ReplicaId(f"b{i}") for i in range(n)]
    for r in names:
        router.add_replica(r)
    return router, names


def test_shortlist_is_off_for_small_clusters_and_on_for_large_ones() -> None:
    small = make_router("predicted_ttft")
    view = small.view("s", tokens=tokens(8))
    ctx = RoutingContext(view, NAMES, small.index, small.loads, small.rng, 0.0)
    assert ctx.shortlist(64, 16, 16) is ctx
    router, names = big_router(200)
    view = router.view("b", tokens=tokens(8))
    ctx = RoutingContext(view, names, router.index, router.loads, router.rng, 0.0)
    narrowed = ctx.shortlist(64, 16, 16)
    assert len(narrowed.candidates) == 16  # nobody matches: the random sample only
    assert set(narrowed.candidates) <= set(names)


def test_shortlist_finds_the_one_replica_with_the_prefix_among_hundreds() -> None:
    router, names = big_router(300)
    home = names[137]
    prompt = tokens(200)
    prime(router, home, prompt[:150])
    for r in names[::3]:
        prime(router, r, prompt[:4])  # a short shared prefix, held by 100 replicas
    decision = router.route(router.view("q", tokens=prompt), 0.0)
    assert decision.replica == home
    assert decision.reason is DecisionReason.PREFIX_MATCH
    assert decision.predicted_cached_tokens == 150


def test_shortlist_respects_the_candidate_list() -> None:
    router, names = big_router(200)
    prompt = tokens(100)
    prime(router, names[5], prompt)
    allowed = names[100:]  # the replica with the prefix is not a candidate (unhealthy, say)
    decision = router.route(router.view("q", tokens=prompt), 0.0, allowed)
    assert decision.replica in allowed


def test_shortlist_spreads_cold_requests_like_power_of_d_choices() -> None:
    router, _ = big_router(200)
    for i in range(200):
        router.route(router.view(f"c{i}", tokens=tokens(500, start=FILLER + 1000 * i)), 0.0)
    in_flight = [router.loads.get(r).in_flight for r in router.replicas]
    # The best of 16 random replicas: nearly every replica gets one request, none gets three.
    assert max(in_flight) <= 2
    assert sum(1 for k in in_flight if k) >= 150


def test_shortlist_parameters_are_validated() -> None:
    with pytest.raises(ConfigError, match="shortlist"):
        make_policy("predicted_ttft", shortlist_sample=0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"prefill_tokens_per_s": "fast"}, "prefill_tokens_per_s must be a number, got 'fast'"),
        ({"prefill_tokens_per_s": True}, "prefill_tokens_per_s must be a number, got True"),
        ({"step_tokens": 1.5}, "step_tokens must be an integer, got 1.5"),
        ({"learned_speeds": "no"}, "learned_speeds must be true or false, got 'no'"),
        ({"learned_speeds": 2}, "learned_speeds must be true or false, got 2"),
    ],
)
def test_a_parameter_of_the_wrong_type_is_a_config_error(
    params: dict[str, object], message: str
) -> None:
    # The config dataclasses take any value: "fast" failed later as a bare TypeError.
    with pytest.raises(ConfigError, match=f"^policy 'predicted_ttft': parameter {message}$"):
        make_policy("predicted_ttft", **params)


def test_parameters_of_the_right_type_are_taken() -> None:
    policy = make_policy("predicted_ttft", prefill_tokens_per_s=5, learned_speeds=0, step_tokens=8)
    assert policy.config.prefill_tokens_per_s == 5 and policy.config.step_tokens == 8
    make_policy("cache_aware", cache_threshold=0.5, balance_abs_threshold=3)
