"""What the router and policy tests share: four replicas, a router over them with block size 1
(a token is a block), ways to fill its cache and its load, and the context its policy decides
in."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefixroute.core import (
    BlockHasher,
    Decision,
    DecisionReason,
    LoadTracker,
    ReplicaId,
    RequestView,
    Router,
    RoutingContext,
    make_policy,
)

NAMES = [ReplicaId(f"r{i}") for i in range(4)]
R0, R1, R2, R3 = NAMES
_ids = itertools.count()


def router_over(
    policy: str,
    replicas: Iterable[ReplicaId],
    *,
    block_size: int = 1,
    params: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Router:
    """A router with ``policy`` (``params`` its parameters, else its defaults) over
    ``replicas``, hashing blocks of ``block_size`` tokens; ``kwargs`` go to ``Router``."""
    hasher = BlockHasher(block_size=block_size)
    router = Router(make_policy(policy, **(params or {})), hasher, **kwargs)
    for r in replicas:
        router.add_replica(r)
    return router


def make_router(policy: str, *, seed: int = 0, n: int = 4, **params: Any) -> Router:
    """A router over the first ``n`` of ``NAMES``; ``params`` go to the policy."""
    return router_over(policy, NAMES[:n], params=params, seed=seed)


def context_of(
    router: Router,
    view: RequestView,
    candidates: Sequence[ReplicaId] | None = None,
    now: float = 0.0,
) -> RoutingContext:
    """What a policy of ``router`` is asked to decide on: ``view`` among ``candidates`` (by
    default every replica), with the router's index, load view and random generator."""
    cands = router.replicas if candidates is None else candidates
    return RoutingContext(view, cands, router.index, router.loads, router.rng, now)


def context(
    router: Router,
    toks: Sequence[int],
    candidates: Sequence[ReplicaId] | None = None,
    now: float = 0.0,
) -> RoutingContext:
    """:func:`context_of` a new request for ``toks``."""
    return context_of(router, router.view(f"ctx{next(_ids)}", tokens=toks), candidates, now)


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def prime(router: Router, replica: ReplicaId, toks: Sequence[int]) -> None:
    """Make the index believe ``replica`` caches ``toks``."""
    router.index.insert(replica, router.hasher.hash_tokens(toks))


def dispatch(router: Router, replica: ReplicaId, prompt: int = 0, now: float = 0.0) -> str:
    """One request of ``prompt`` uncached tokens on ``replica``'s load only; returns its id."""
    rid = f"load{next(_ids)}"
    view = RequestView(rid, (), 1, prompt, prompt)
    router.loads.dispatch(view, Decision(replica, DecisionReason.LEAST_LOADED, 0), now)
    return rid


def busy(
    router: Router,
    replica: ReplicaId,
    n: int = 1,
    *,
    prompt: int = 0,
    prefilled: bool = False,
    now: float = 0.0,
) -> None:
    """``n`` in-flight requests of ``prompt`` uncached tokens on ``replica``'s load only; with
    ``prefilled`` they are decoding (their first token came back)."""
    for _ in range(n):
        rid = dispatch(router, replica, prompt, now)
        if prefilled:
            router.loads.first_token(rid, now)


def arrivals(router: Router, replica: ReplicaId, n: int, prompt: int) -> None:
    """``n`` requests of ``prompt`` uncached tokens that arrived at ``replica`` at time 0 and
    are already over: they count in its recent arrival rate only."""
    for _ in range(n):
        router.loads.complete(dispatch(router, replica, prompt), 0.0)


def busy_each(router: Router, queues: dict[ReplicaId, int]) -> None:
    """``busy`` with each replica's number of in-flight requests."""
    for replica, n in queues.items():
        busy(router, replica, n)


def send(tracker: LoadTracker, rid: str, prompt: int, output: int, now: float) -> None:
    """Request ``rid`` (``prompt`` tokens, none predicted cached) dispatched to r0 at ``now``."""
    view = RequestView(rid, (), 16, prompt, prompt, output)
    tracker.dispatch(view, Decision(R0, DecisionReason.LEAST_LOADED, 0), now)
