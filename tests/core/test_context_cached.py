"""A context's predicted cached tokens for one replica (``RoutingContext.cached_tokens``) are the
ones :attr:`RoutingContext.cached` gives it, whether or not the policy read every candidate's
matches first: a policy that never reads them (round robin) has only the chosen replica looked
up, and must report the same number a prefix policy would.

Block size 1 (a token is a block). The expected numbers are worked by hand from the docstring of
``cached``: the match, capped at ``prompt - 1`` tokens (the engine recomputes the last one), the
longer of the index's and the recent decisions' (speculative) matches.
"""

from __future__ import annotations

import pytest

from prefixroute.core import DecisionReason, ReplicaId, Router
from prefixroute.core.speculative import SpeculativeEntries

from .helpers import R0, R1, R2, R3, context, make_router, prime, tokens

PROMPT = tokens(50)
# R0 caches the whole prompt (capped at 49), R1 its first 10 tokens and R3 nothing; R2 has 5 in
# the index and was just sent the first 20 (a speculative entry, precise mode).
EXPECTED = {R0: 49, R1: 10, R2: 20, R3: 0}


def fleet() -> tuple[Router, SpeculativeEntries]:
    router = make_router("round_robin")
    prime(router, R0, PROMPT)
    prime(router, R1, PROMPT[:10])
    prime(router, R2, PROMPT[:5])
    recent = SpeculativeEntries(ttl_s=1.0)
    recent.add(R2, router.hasher.hash_tokens(PROMPT[:20]), 0.0)
    return router, recent


@pytest.mark.parametrize("replica", list(EXPECTED))
@pytest.mark.parametrize("read_first", ["nothing", "matches", "cached"])
def test_one_replica_counts_as_every_candidate_does(replica: ReplicaId, read_first: str) -> None:
    router, recent = fleet()
    ctx = context(router, PROMPT)
    ctx.speculative = recent
    if read_first == "matches":
        assert ctx.matches[R0] == 50  # read, not converted: the conversion is cached_tokens'
    elif read_first == "cached":
        assert ctx.cached == EXPECTED
    assert ctx.cached_tokens(replica) == EXPECTED[replica]


def test_round_robin_reports_the_chosen_replicas_cache() -> None:
    router, recent = fleet()
    seen: dict[ReplicaId, int] = {}
    for _ in range(4):  # round robin visits each replica once
        ctx = context(router, PROMPT)
        ctx.speculative = recent
        decision = router.policy.decide(ctx)
        assert decision.reason is DecisionReason.ROUND_ROBIN
        seen[decision.replica] = decision.predicted_cached_tokens
    assert seen == EXPECTED
