"""The shortlist's candidate pool (``RoutingContext.candidate_set``): the router hands its own
set of registered replicas to a decision only when every replica is a candidate, so a shortlist
never reaches a replica the caller left out; with or without that set, a decision is the same.

Above 64 candidates ``predicted_ttft`` scores a shortlist: the replicas with the longest matches
(from the index's holder map) and a random sample (README, Known limits; ``shortlist``'s
docstring). Block size 1 (a token is a block).
"""

from __future__ import annotations

from prefixroute.core import DecisionReason, ReplicaId, Router

from .helpers import context, prime, router_over, tokens

SHORT = (64, 16, 16)  # predicted_ttft's defaults: above, top, sample
PROMPT = tokens(200)


def fleet(n: int = 100, seed: int = 0) -> tuple[Router, list[ReplicaId]]:
    names = [ReplicaId(f"p{i:03}") for i in range(n)]
    router = router_over("predicted_ttft", names, seed=seed)
    prime(router, names[40], PROMPT)  # the one replica that holds the whole prompt
    return router, names


def test_a_replica_left_out_of_the_candidates_is_never_shortlisted() -> None:
    for seed in range(8):  # fresh each time: a decision puts the prompt where it sends it
        router, names = fleet(seed=seed)
        assert router.index.has_holder_map
        without = [r for r in names if r != names[40]]
        decision = router.route(router.view("out", tokens=PROMPT), 0.0, without)
        assert decision.replica != names[40]
        assert decision.predicted_cached_tokens == 0  # nobody else holds any of it


def test_every_replica_a_candidate_finds_the_holder() -> None:
    router, names = fleet()
    decision = router.route(router.view("all", tokens=PROMPT), 0.0)  # candidates: all
    assert decision.replica == names[40]
    assert decision.predicted_cached_tokens == 199  # the whole prompt but the last token


def test_the_set_changes_nothing_but_who_builds_it() -> None:
    (router, names), (twin, _) = fleet(), fleet()  # the same random state each
    plain = context(router, PROMPT, names)
    given = context(twin, PROMPT, names)
    given.candidate_set = frozenset(names)
    a, b = plain.shortlist(*SHORT), given.shortlist(*SHORT)
    assert a.candidates == b.candidates and a.matches == b.matches
    assert names[40] in a.candidates and len(a.candidates) <= 1 + 16


def test_an_explained_decision_over_a_shortlist_lists_what_it_scored() -> None:
    # /admin/explain and tracing at a thousand replicas: the narrowed context still explains,
    # with the reason the decision was made for and every shortlisted candidate's numbers.
    router, names = fleet()
    decision = router.explain(router.view("why", tokens=PROMPT), 0.0)
    assert decision.replica == names[40]
    assert decision.reason is DecisionReason.PREFIX_MATCH
    scored = {c.replica: c for c in decision.candidates}
    assert names[40] in scored and 2 <= len(scored) <= 1 + 16
    assert scored[names[40]].matched_blocks == 200 and scored[names[40]].cached_tokens == 199
    assert all(c.predicted_ttft_s is not None for c in scored.values())
