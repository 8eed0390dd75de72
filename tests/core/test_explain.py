"""Explaining a decision (issue 14 item 4: "the per-candidate scores for a request ... useful when
a user asks 'why did my request go there?'"): ``Router.route(..., explain=True)`` fills
``Decision.candidates``; ``Router.explain`` answers the same without routing anything."""

from __future__ import annotations

import pytest

from prefixroute.core import BlockHasher, ReplicaId, Router, make_policy
from prefixroute.core.policies.predicted_ttft import PredictedTTFT

A, B, C = ReplicaId("a"), ReplicaId("b"), ReplicaId("c")
PROMPT = list(range(64))  # 4 blocks of 16


def router(policy: str = "predicted_ttft") -> Router:
    r = Router(make_policy(policy), BlockHasher(block_size=16))
    for rid in (A, B, C):
        r.add_replica(rid)
    return r


def warm(r: Router) -> None:
    """A holds the whole prompt (and is busy with it); B holds its first two blocks."""
    r.route(r.view("warm-a", tokens=PROMPT, output_tokens=8), 0.0, [A])
    r.route(r.view("warm-b", tokens=PROMPT[:32] + [999] * 32), 0.0, [B])
    r.complete("warm-b", 0.1)


def test_a_plain_decision_carries_no_explanation() -> None:
    r = router()
    warm(r)
    assert r.route(r.view("q", tokens=PROMPT), 1.0).candidates == ()


def test_an_explained_decision_describes_every_candidate_in_order() -> None:
    r = router()
    warm(r)
    d = r.route(r.view("q", tokens=PROMPT), 1.0, explain=True)
    assert [c.replica for c in d.candidates] == [A, B, C]
    by = {c.replica: c for c in d.candidates}
    assert [by[x].matched_blocks for x in (A, B, C)] == [4, 2, 0]
    assert by[A].cached_tokens == 48  # the full blocks inside prompt - 1 (the last is recomputed)
    assert by[B].cached_tokens == 32
    assert (by[A].in_flight, by[B].in_flight, by[C].in_flight) == (1, 0, 0)
    assert by[A].queued_prefill_tokens == 64  # warm-a: not yet prefilled
    # The default policy minimises its score; the chosen replica has the lowest one.
    scores = {c.replica: c.score for c in d.candidates}
    assert all(s is not None for s in scores.values())
    assert scores[d.replica] == min(s for s in scores.values() if s is not None)


def test_the_default_policys_predicted_ttft_is_its_prediction() -> None:
    r = router()
    warm(r)
    view = r.view("q", tokens=PROMPT)
    d = r.explain(view, 1.0)
    policy = r.policy
    assert isinstance(policy, PredictedTTFT)
    for c in d.candidates:
        assert c.predicted_ttft_s is not None and c.score is not None
        assert c.score >= c.predicted_ttft_s  # the score adds the delay imposed on others
    idle = {c.replica: c for c in d.candidates}[C]
    assert idle.score == idle.predicted_ttft_s  # nobody on C to delay


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware", "least_loaded"])
def test_other_policies_explain_matches_and_load_without_scores(policy: str) -> None:
    r = router(policy)
    warm(r)
    d = r.route(r.view("q", tokens=PROMPT), 1.0, explain=True)
    assert [c.matched_blocks for c in d.candidates] == [4, 2, 0]
    assert all(c.score is None and c.predicted_ttft_s is None for c in d.candidates)


def test_explain_changes_nothing() -> None:
    r = router("round_robin")
    warm(r)
    blocks, loads = r.index_blocks(), [r.replica_load(x).in_flight for x in (A, B, C)]
    first = r.explain(r.view("dry", tokens=list(range(500, 564))), 1.0)
    again = r.explain(r.view("dry", tokens=list(range(500, 564))), 1.0)
    assert first.replica == again.replica  # round robin did not move on
    assert r.index_blocks() == blocks
    assert [r.replica_load(x).in_flight for x in (A, B, C)] == loads
    real = r.route(r.view("real", tokens=list(range(500, 564))), 1.0)
    assert real.replica == first.replica  # the explanation named where it would really go
    assert first.candidates and real.candidates == ()


def test_an_explanation_weighs_only_the_candidates_it_is_given() -> None:
    """``candidates``: the replicas the request could go to (the model's, the healthy ones);
    the explanation describes those and picks among them, as the route would."""
    r = router()
    warm(r)
    d = r.explain(r.view("q", tokens=PROMPT), 1.0, [B, C])
    assert [c.replica for c in d.candidates] == [B, C]
    assert d.replica in (B, C)
