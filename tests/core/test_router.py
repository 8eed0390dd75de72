"""Tests for prefixroute.core.router: the route / first token / complete cycle end to end."""

from __future__ import annotations

import random

import pytest

from prefixroute.core import (
    BlockHash,
    BlockHasher,
    ConfigError,
    Decision,
    DecisionReason,
    NoReplicaAvailable,
    PrefixrouteError,
    ReplicaId,
    Router,
    make_policy,
    policy_names,
)

from .helpers import router_over

NAMES = [ReplicaId(f"r{i}") for i in range(5)]
TURNS = [400, 700, 1000, 1400, 1700]  # the article's conversation: each prompt extends the last


def make_router(policy: str, n: int = 5, **kwargs: int) -> Router:
    return router_over(policy, NAMES[:n], **kwargs)


def conversation(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    full = [rng.randrange(150_000) for _ in range(TURNS[-1])]
    return [full[:n] for n in TURNS]


def run_conversation(router: Router, seed: int = 0) -> list[tuple[ReplicaId, DecisionReason, int]]:
    out = []
    known: list[BlockHash] = []
    for turn, prompt in enumerate(conversation(seed)):
        view = router.view(f"turn{turn}", tokens=prompt, output_tokens=50, known=known)
        assert list(view.block_hashes) == router.hasher.hash_tokens(prompt)
        known = list(view.block_hashes)
        decision = router.route(view, now=float(turn))
        router.first_token(view.request_id, now=turn + 0.1)
        router.complete(view.request_id, now=turn + 0.5)
        out.append((decision.replica, decision.reason, decision.predicted_cached_tokens))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_article_conversation_stays_on_one_replica_under_predicted_ttft(seed: int) -> None:
    router = make_router("predicted_ttft", seed=seed)
    turns = run_conversation(router, seed)
    assert len({r for r, _, _ in turns}) == 1
    assert [cached for _, _, cached in turns] == [0, 400, 700, 1000, 1400]
    assert [reason for _, reason, _ in turns] == [DecisionReason.LEAST_LOADED] + [
        DecisionReason.PREFIX_MATCH
    ] * 4
    for r in NAMES:
        assert router.loads[r].in_flight == 0


def test_article_conversation_scatters_under_round_robin() -> None:
    router = make_router("round_robin")
    turns = run_conversation(router)
    assert [r for r, _, _ in turns] == NAMES
    assert [cached for _, _, cached in turns] == [0, 0, 0, 0, 0]


def test_no_replicas_raises_no_replica_available() -> None:
    router = make_router("predicted_ttft", n=0)
    view = router.view("a", tokens=[1, 2, 3])
    with pytest.raises(NoReplicaAvailable):
        router.route(view, 0.0)
    router.add_replica(NAMES[0])
    with pytest.raises(NoReplicaAvailable):
        router.route(view, 0.0, candidates=[])
    assert issubclass(NoReplicaAvailable, PrefixrouteError)


@pytest.mark.parametrize("policy", policy_names())
def test_a_removed_replica_is_never_chosen(policy: str) -> None:
    router = make_router(policy, n=4)
    gone = NAMES[2]
    prompt = list(range(300))
    for i in range(5):  # make it the best-cached replica first
        router.route(router.view(f"warm{i}", tokens=prompt), 0.0, candidates=[gone])
    router.remove_replica(gone)
    assert gone not in router.replicas
    assert gone not in router.index.replicas
    assert gone not in router.loads.replicas
    assert router.index.match(router.hasher.hash_tokens(prompt)) == {}
    for i in range(60):
        view = router.view(f"q{i}", tokens=prompt[: 100 + i], session_id=f"s{i % 7}")
        assert router.route(view, float(i)).replica != gone
    router.complete("warm0", 1.0)  # in flight when its replica left: completes quietly


def test_single_candidate_gives_reason_only_candidate() -> None:
    router = make_router("round_robin", n=1)
    d = router.route(router.view("a", tokens=[1, 2, 3]), 0.0)
    assert (d.replica, d.reason, d.predicted_cached_tokens) == (
        NAMES[0],
        DecisionReason.ONLY_CANDIDATE,
        0,
    )
    router = make_router("predicted_ttft", n=4)
    router.route(router.view("b", tokens=list(range(10))), 0.0, candidates=[NAMES[3]])
    d = router.route(router.view("c", tokens=list(range(10))), 0.0, candidates=[NAMES[3]])
    assert (d.replica, d.reason, d.predicted_cached_tokens) == (
        NAMES[3],
        DecisionReason.ONLY_CANDIDATE,
        9,
    )


def test_route_records_the_decision_in_index_and_load() -> None:
    router = Router(make_policy("least_loaded"), BlockHasher(block_size=4), kv_block_size=16)
    router.add_replica(NAMES[0])
    router.add_replica(NAMES[1])
    view = router.view("a", tokens=list(range(42)), output_tokens=22)
    d = router.route(view, 0.0)
    assert router.index.match(view.block_hashes) == {d.replica: 10}
    load = router.loads[d.replica]
    assert (load.in_flight, load.prefilling, load.queued_prefill_tokens) == (1, 1, 42)
    assert load.active_blocks == 4  # ceil((42 + 22) / 16)
    router.first_token("a", 1.0)
    assert (load.prefilling, load.queued_prefill_tokens) == (0, 0)
    router.complete("a", 2.0)
    router.complete("a", 2.0)
    assert (load.in_flight, load.active_blocks, load.completed) == (0, 0, 1)


def test_block_granular_cache_prediction_like_vllm() -> None:
    # With 16-token blocks, a fully cached 32-token prompt still recomputes its last block.
    router = Router(make_policy("predicted_ttft"), BlockHasher(block_size=16))
    router.add_replica(NAMES[0])  # a single replica: the prediction, not the policy, is tested
    prompt = list(range(32))
    router.route(router.view("a", tokens=prompt), 0.0)
    assert router.route(router.view("b", tokens=prompt), 0.0).predicted_cached_tokens == 16
    longer = router.route(router.view("c", tokens=prompt + [7]), 0.0)
    assert longer.predicted_cached_tokens == 32


def test_text_mode_hashes_characters_and_estimates_tokens() -> None:
    router = Router(make_policy("predicted_ttft"), BlockHasher(block_size=4))
    router.add_replica(NAMES[0])
    first = router.view("a", text="é" * 400)
    assert (first.prompt_units, first.prompt_tokens, len(first.block_hashes)) == (400, 100, 100)
    assert router.route(first, 0.0).predicted_cached_tokens == 0
    router.complete("a", 1.0)
    second = router.view("b", text="é" * 400 + "ü" * 40, known=first.block_hashes)
    assert list(second.block_hashes) == router.hasher.hash_text("é" * 400 + "ü" * 40)
    d = router.route(second, 0.0)
    assert d.predicted_cached_tokens == 100  # 400 cached characters at 4 characters per token
    assert router.view("c", text="", output_tokens=3).prompt_tokens == 0
    assert router.view("d", text="hi").prompt_tokens == 1
    assert router.view("e", text="x" * 40, prompt_tokens=7).prompt_tokens == 7


def test_view_needs_exactly_one_of_tokens_or_text() -> None:
    router = make_router("round_robin")
    with pytest.raises(ConfigError):
        router.view("a")
    with pytest.raises(ConfigError):
        router.view("a", tokens=[1], text="x")


def test_view_carries_request_metadata() -> None:
    router = make_router("round_robin")
    view = router.view("a", tokens=[1, 2], output_tokens=9, session_id="s", tenant="t", model="m")
    assert (view.output_tokens, view.session_id, view.tenant, view.model) == (9, "s", "t", "m")
    assert (view.prompt_tokens, view.prompt_units, view.block_size) == (2, 2, 1)


def test_add_replica_is_idempotent() -> None:
    router = make_router("round_robin", n=2)
    router.add_replica(NAMES[0])
    assert router.replicas == NAMES[:2]
    router.remove_replica(NAMES[4])  # unknown: no-op
    assert router.replicas == NAMES[:2]


def test_index_capacity_bounds_every_replica() -> None:
    router = make_router("round_robin", n=2, index_capacity_blocks=50)
    for i in range(10):
        router.route(router.view(f"q{i}", tokens=list(range(i * 1000, i * 1000 + 80))), 0.0)
    assert all(router.index.blocks_of(r) <= 50 for r in router.replicas)
    assert router.index.evictions > 0


def burst(ttl: float | None) -> tuple[Router, list[Decision]]:
    """Six requests sharing a 4,000-token prefix, all in flight at once, no events yet."""
    router = Router(
        make_policy("prefix_affinity"),
        BlockHasher(block_size=4),
        insert_on_route=False,
        speculative_ttl_s=ttl,
    )
    for r in NAMES[:3]:
        router.add_replica(r)
    prefix = list(range(4000))
    chosen = []
    for i in range(6):
        view = router.view(f"b{i}", tokens=prefix + [1000 + i] * 8, output_tokens=8)
        chosen.append(router.route(view, now=0.01 * i))
    return router, chosen


def test_precise_mode_leaves_the_index_to_events_and_covers_a_burst_speculatively() -> None:
    """insert_on_route=False: decisions do not touch the index; a speculative entry keeps a burst
    sharing a new prefix together until it expires. Without one the burst scatters."""
    router, chosen = burst(ttl=2.0)
    assert router.index.entries == 0  # nothing inserted on route
    assert len({d.replica for d in chosen}) == 1
    assert [d.predicted_cached_tokens for d in chosen] == [0] + [4000] * 5
    assert all(d.reason is DecisionReason.PREFIX_MATCH for d in chosen[1:])
    # Past the TTL, with no events, the router no longer believes it.
    view = router.view("late", tokens=list(range(4000)) + [7] * 8, output_tokens=8)
    assert router.route(view, now=5.0).predicted_cached_tokens == 0
    _, scattered = burst(ttl=None)
    assert len({d.replica for d in scattered}) == 3


def test_precise_mode_trusts_the_index_fed_by_events() -> None:
    router = Router(make_policy("predicted_ttft"), BlockHasher(block_size=4), insert_on_route=False)
    for r in NAMES[:3]:
        router.add_replica(r)
    tokens = list(range(40))
    router.index.insert(NAMES[2], router.hasher.hash_tokens(tokens[:32]))  # as events would
    decision = router.route(router.view("x", tokens=tokens), now=0.0)
    assert decision.replica == NAMES[2]
    assert decision.predicted_cached_tokens == 32
    assert router.index.blocks_of(NAMES[2]) == 8
    assert router.speculative is None


def test_a_seeded_view_matches_only_its_own_seed() -> None:
    """Per-tenant key spaces: identical prompts under different seeds never share a block."""
    router = make_router("predicted_ttft", n=2)
    tokens = list(range(400))
    plain = router.view("p", tokens=tokens)
    a = router.view("a", tokens=tokens, seed=11, tenant="a")
    assert router.view("d", tokens=tokens, seed=None).block_hashes == plain.block_hashes
    assert set(a.block_hashes).isdisjoint(plain.block_hashes)
    assert set(a.block_hashes).isdisjoint(router.view("b", tokens=tokens, seed=12).block_hashes)
    assert (
        router.view("t", text="x" * 40, seed=11).block_hashes
        != router.view("u", text="x" * 40).block_hashes
    )
    first = router.route(a, now=0.0)
    again = router.route(router.view("a2", tokens=tokens + [1], seed=11), now=0.1)
    assert again.replica == first.replica and again.predicted_cached_tokens == 400
    stranger = router.route(router.view("b2", tokens=tokens, seed=12), now=0.2)
    assert stranger.predicted_cached_tokens == 0
    # ``known`` hashes from the same seed are reused, and give the same chain.
    longer = tokens + list(range(1000, 1100))
    assert router.view("k", tokens=longer, seed=11, known=a.block_hashes).block_hashes == (
        router.view("k2", tokens=longer, seed=11).block_hashes
    )
    with pytest.raises(ConfigError):
        router.view("bad", tokens=tokens, seed=-1)


def test_has_replica_follows_add_and_remove() -> None:
    router = Router(make_policy("round_robin"))
    a, b = ReplicaId("a"), ReplicaId("b")
    router.add_replica(a)
    router.add_replica(b)
    router.add_replica(a)  # idempotent: still listed once
    assert router.replicas == [a, b]
    assert router.has_replica(a) and router.has_replica(b)
    router.remove_replica(a)
    assert not router.has_replica(a) and router.replicas == [b]
    router.add_replica(a)  # back, at the end
    assert router.has_replica(a) and router.replicas == [b, a]


@pytest.mark.parametrize("mode", ["tokens", "text"])
def test_a_prefix_cached_under_one_adapter_never_counts_for_another(mode: str) -> None:
    """vLLM keeps each LoRA adapter's blocks apart: the same prompt under another adapter, or
    the base model, is predicted uncached, and under the same adapter it is a full hit. A
    tenant's seed composes with the adapter."""
    router = make_router("predicted_ttft", n=1)
    prompt = list(range(400))

    def cached(rid: str, adapter: str | None, seed: int | None = None) -> int:
        if mode == "tokens":
            view = router.view(rid, tokens=prompt + [1], adapter=adapter, seed=seed)
        else:
            view = router.view(rid, text="x" * 401, adapter=adapter, seed=seed)
        decision = router.route(view, now=0.0)
        router.complete(rid, now=0.1)
        return decision.predicted_cached_tokens

    assert cached("a1", "a") == 0
    assert cached("b", "b") == 0
    assert cached("base", None) == 0
    assert cached("t", "a", seed=11) == 0  # a tenant's own space within the adapter's
    # Text: 401 characters are 100 tokens at 4 a token, and the 400 cached ones would round to
    # all 100; the engine recomputes the last token.
    full = 400 if mode == "tokens" else 99
    assert cached("a2", "a") == full
    assert cached("b2", "b") == full
    assert cached("t2", "a", seed=11) == full
