"""Router and speculative entries at their documented edges (core/router.py, core/speculative.py;
docs/mutation.md): defaults, what is passed through to the index and the load view, the
misprediction counters, and the messages of the errors."""

from __future__ import annotations

from typing import ClassVar

import pytest

from prefixroute.core import (
    BlockHash,
    ConfigError,
    Decision,
    DecisionReason,
    NoReplicaAvailable,
    ReplicaId,
    Router,
    RoutingContext,
)
from prefixroute.core.speculative import SpeculativeEntries

from .helpers import router_over

A, B = ReplicaId("a"), ReplicaId("b")


def router(policy: str = "round_robin", **kwargs: object) -> Router:
    return router_over(policy, (A, B), **kwargs)


def test_the_default_seed_is_0() -> None:
    def picks(r: Router) -> list[ReplicaId]:
        return [r.route(r.view(f"q{i}", tokens=[i]), 0.0).replica for i in range(30)]

    assert picks(router("random")) == picks(router("random", seed=0))
    assert picks(router("random")) != picks(router("random", seed=1))


def test_kv_block_size_sizes_the_load_views_blocks() -> None:
    r = router(kv_block_size=32)
    view = r.view("q", tokens=list(range(60)), output_tokens=40)  # 100 tokens: 4 blocks of 32
    d = r.route(view, 0.0)
    assert r.loads[d.replica].active_blocks == 4


def test_a_replicas_own_index_capacity_is_kept() -> None:
    r = router()
    c = ReplicaId("c")
    r.add_replica(c, capacity_blocks=2)
    r.index.insert(c, r.hasher.hash_tokens([1, 2, 3, 4]))
    assert r.index.blocks_of(c) == 2


def test_a_view_expects_no_output_unless_told_and_trusts_known_hashes() -> None:
    r = router()
    assert r.view("q", tokens=[1, 2]).output_tokens == 0
    fake = [BlockHash(12345)]
    assert list(r.view("t", tokens=[1, 2, 3], known=fake).block_hashes)[:1] == fake
    assert list(r.view("x", text="abc", known=fake).block_hashes)[:1] == fake
    with pytest.raises(ConfigError) as info:
        r.view("bad", tokens=[1], text="a")
    assert str(info.value) == "a request view needs exactly one of tokens or text"


def test_routing_with_no_candidate_says_so() -> None:
    r = router()
    with pytest.raises(NoReplicaAvailable) as info:
        r.route(r.view("q", tokens=[1]), 0.0, [])
    assert str(info.value) == "no replica available to route to"


def test_a_first_token_is_measured_unless_told_otherwise() -> None:
    r = router()
    for i, measured in enumerate((None, True, False)):
        view = r.view(f"q{i}", tokens=list(range(100)), output_tokens=5)
        d = r.route(view, 10.0)
        speed = r.loads[d.replica].speed
        before = (speed.prefill_observations, speed.decode_observations)
        if measured is None:
            r.first_token(view.request_id, 10.5)  # the default: a token seen
        else:
            r.first_token(view.request_id, 10.5, measured=measured)
        r.complete(view.request_id, 11.0, output_tokens=5)
        after = (speed.prefill_observations, speed.decode_observations)
        learned = (after[0] - before[0], after[1] - before[1])
        assert learned == ((0, 0) if measured is False else (1, 1)), measured


def test_usage_reports_count_overpredictions_and_their_tokens() -> None:
    r = router()
    cases = [(0, 40), (10, 40), (100, 0), (100, 100)]
    for i, (cached_reported, predicted_cached) in enumerate(cases):
        view = r.view(f"q{i}", tokens=list(range(1000 * i, 1000 * i + 100)))
        r.loads.dispatch(view, Decision(A, DecisionReason.LEAST_LOADED, predicted_cached), 0.0)
        r.observe_usage(view.request_id, prompt_tokens=100, cached_tokens=cached_reported)
    # predicted uncached 60, 60, 100, 0; found 100, 90, 0, 0: two too hopeful, by 40 + 30.
    assert (r.usage_reports, r.overpredicted, r.overpredicted_tokens) == (4, 2, 70)


def test_a_policy_without_a_config_gets_the_default_speed_priors() -> None:
    class First:
        name: ClassVar[str] = "first"

        def decide(self, ctx: RoutingContext) -> Decision:
            return ctx.decide(ctx.candidates[0], DecisionReason.LEAST_LOADED)

    r = Router(First())
    r.add_replica(A)
    assert r.route(r.view("q", tokens=[1, 2, 3]), 0.0).replica == A
    assert r.loads[A].speed.prefill_tokens_per_s == 10_000.0


def test_removing_a_replica_drops_its_speculative_entries() -> None:
    r = router("predicted_ttft", insert_on_route=False, speculative_ttl_s=10.0)
    assert r.speculative is not None
    d = r.route(r.view("q", tokens=list(range(50))), 0.0)
    assert r.speculative.blocks_of(d.replica) == 50
    r.remove_replica(d.replica)
    assert r.speculative.blocks_of(d.replica) == 0


def test_expiry_goes_on_past_a_removed_replicas_entries() -> None:
    spec = SpeculativeEntries(ttl_s=1.0)
    spec.add(A, [BlockHash(1), BlockHash(2)], now=0.0)
    spec.add(B, [BlockHash(3)], now=0.5)
    spec.remove_replica(A)
    spec.remove_replica(ReplicaId("never-seen"))  # harmless
    spec.expire(2.0)
    assert spec.blocks_of(B) == 0
    with pytest.raises(ConfigError) as info:
        SpeculativeEntries(ttl_s=0.0)
    assert str(info.value) == "the speculative entry TTL must be positive, got 0.0"
