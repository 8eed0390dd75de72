"""Index capacity learned from reported cached tokens (core/index_capacity.py's docstring)."""

from __future__ import annotations

import math

import pytest

from prefixroute.core import (
    BlockHasher,
    ConfigError,
    IndexCapacityConfig,
    PrefixIndex,
    ReplicaId,
    Router,
    make_policy,
)
from prefixroute.core._lru import ReplicaLRU
from prefixroute.core.index_capacity import IndexCapacity

R = ReplicaId("r0")
ON = IndexCapacityConfig(learn=True)


def learner(configured: int = 1000, **config: float) -> IndexCapacity:
    cap = IndexCapacity(IndexCapacityConfig(learn=True, **config))  # type: ignore[arg-type]
    cap.track(R, configured)
    return cap


def test_fewer_cached_than_predicted_shrinks_by_one_gain_step() -> None:
    cap = learner(gain=0.1)
    assert cap.vote(R, predicted=500, actual=100, tolerance=16) == int(1000 * math.exp(-0.1))
    state = cap.get(R)
    assert state is not None and (state.too_large, state.too_small) == (1, 0)


def test_more_cached_than_predicted_grows_but_never_past_the_configured_capacity() -> None:
    cap = learner(gain=0.1)
    for _ in range(5):
        cap.vote(R, predicted=500, actual=0, tolerance=16)
    shrunk = cap.get(R)
    assert shrunk is not None and shrunk.blocks < 700
    grown = cap.vote(R, predicted=0, actual=500, tolerance=16)
    assert grown is not None and grown > int(shrunk.blocks * 0 + 606)  # one step up from ~606
    for _ in range(50):
        cap.vote(R, predicted=0, actual=500, tolerance=16)
    assert shrunk.blocks == 1000.0 and shrunk.too_small == 51


def test_a_difference_within_the_tolerance_is_no_vote() -> None:
    cap = learner()
    assert cap.vote(R, predicted=500, actual=484, tolerance=16) is None
    assert cap.vote(R, predicted=484, actual=500, tolerance=16) is None
    state = cap.get(R)
    assert state is not None and (state.blocks, state.too_large, state.too_small) == (1000, 0, 0)


def test_the_estimate_stops_at_min_fraction_of_the_configured_capacity() -> None:
    cap = learner(gain=0.5, min_fraction=0.25)
    for _ in range(40):
        cap.vote(R, predicted=500, actual=0, tolerance=16)
    state = cap.get(R)
    assert state is not None and state.blocks == 250.0


def test_unbounded_untracked_and_switched_off_replicas_learn_nothing() -> None:
    cap = learner()
    cap.track(ReplicaId("unbounded"), None)
    assert cap.vote(ReplicaId("unbounded"), 500, 0, 16) is None
    assert cap.vote(ReplicaId("never-seen"), 500, 0, 16) is None
    off = IndexCapacity()  # learning is off by default
    off.track(R, 1000)
    assert off.get(R) is None and off.vote(R, 500, 0, 16) is None


@pytest.mark.parametrize("bad", [{"gain": 0.0}, {"gain": 1.5}, {"min_fraction": 0.0}])
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        IndexCapacityConfig(**bad)  # type: ignore[arg-type]


def test_resizing_drops_the_least_recently_touched_blocks_first() -> None:
    lru = ReplicaLRU(8)
    lru.touch([1, 2, 3])
    lru.touch([4, 5, 6])
    lru.touch([1, 2, 3])  # now the most recent
    assert lru.resize(3) == 3
    assert sorted(lru.blocks()) == [1, 2, 3]
    assert lru.resize(1) == 2 and list(lru.blocks()) == [1]  # one block is a capacity
    lru.touch([7, 8])  # and it holds from then on
    assert len(lru) == 1
    with pytest.raises(ValueError, match="capacity must be at least 1 block"):
        lru.resize(0)
    with pytest.raises(ValueError, match="an unbounded LRU keeps no order to resize by"):
        ReplicaLRU(None).resize(4)


@pytest.mark.parametrize("compiled", [True, False])
def test_the_index_resizes_a_bounded_replica_and_counts_the_evictions(compiled: bool) -> None:
    index = PrefixIndex(10, compiled=compiled)
    index.insert(R, [1, 2, 3, 4, 5, 6])
    assert index.resize_replica(R, 4) == 2
    assert (index.capacity_of(R), index.blocks_of(R), index.evictions) == (4, 4, 2)
    assert index.match([1, 2, 3, 4, 5, 6]) == {R: 4}  # the chain's tail went, its head stayed
    unbounded = PrefixIndex(None, compiled=compiled)
    unbounded.insert(R, [1, 2])
    assert unbounded.resize_replica(R, 1) == 0 and unbounded.blocks_of(R) == 2
    index.insert(R, [1, 2, 3, 4])
    assert index.resize_replica(R, 2) == 2 and index.evictions == 4  # evictions add up
    assert index.capacity_of(ReplicaId("never-seen")) is None


def _router(capacity: IndexCapacityConfig | None, insert_on_route: bool = True) -> Router:
    router = Router(
        make_policy("cache_aware"), BlockHasher(block_size=1), index_capacity_blocks=1000,
        kv_block_size=1, insert_on_route=insert_on_route, capacity=capacity,
    )  # fmt: skip
    router.add_replica(R)
    return router


def _turn(router: Router, rid: str, prompt: list[int], cached_reported: int) -> int:
    view = router.view(rid, tokens=prompt)
    decision = router.route(view, 0.0)
    router.first_token(rid, 0.1)
    router.observe_usage(rid, len(prompt), cached_reported)
    router.complete(rid, 0.2, 1)
    return decision.predicted_cached_tokens


def test_a_router_told_too_much_trims_its_index_from_reports() -> None:
    router = _router(ON)
    prompt = list(range(600))
    _turn(router, "a", prompt, 0)
    assert _turn(router, "b", prompt, 0) > 500  # the index claims the prefix ...
    learned = router.index_capacity(R)
    assert learned is not None and learned.too_large == 1  # ... the replica said otherwise
    assert learned.blocks < 1000 and router.index.capacity_of(R) == int(learned.blocks)
    assert learned.trimmed == 0  # 600 blocks still fit in ~980
    for i in range(40):
        _turn(router, f"c{i}", prompt, 0)
    assert learned.trimmed > 0 and router.indexed_blocks(R) == int(learned.blocks) < 600


def test_a_replica_removed_and_added_again_learns_its_capacity_afresh() -> None:
    """What was learned belongs to the replica that was removed: the one added again under
    the same address (a new pod, another engine) starts at its configured capacity."""
    router = _router(ON)
    prompt = list(range(600))
    _turn(router, "a", prompt, 0)
    _turn(router, "b", prompt, 0)
    assert router.index_capacity(R) is not None
    assert router.index_capacity(R).blocks < 1000  # type: ignore[union-attr]
    router.remove_replica(R)
    assert router.index_capacity(R) is None
    router.add_replica(R)
    again = router.index_capacity(R)
    assert again is not None and again.blocks == 1000 and again.too_large == 0


def test_by_default_and_in_precise_mode_the_configured_capacity_stands() -> None:
    for router in (_router(None), _router(ON, insert_on_route=False)):
        prompt = list(range(600))
        router.index.insert(R, router.hasher.hash_tokens(prompt))
        for i in range(5):
            _turn(router, f"x{i}", prompt, 0)
        assert router.index_capacity(R) is None and router.index.capacity_of(R) == 1000


def test_a_report_within_one_key_block_and_one_kv_block_is_agreement() -> None:
    """Predictions are counted in key blocks and reports in KV blocks: 16-token blocks here,
    so a report 20 tokens short of the prediction is no evidence, and one 40 short is."""
    router = Router(
        make_policy("cache_aware"), BlockHasher(block_size=16), index_capacity_blocks=1000,
        kv_block_size=16, capacity=ON,
    )  # fmt: skip
    router.add_replica(R)
    prompt = list(range(640))
    _turn(router, "warm", prompt, 0)
    predicted = _turn(router, "near", prompt, 0 + 600)  # reports 600 of ~624 predicted
    learned = router.index_capacity(R)
    assert predicted - 600 < 32 and learned is not None and learned.too_large == 0
    _turn(router, "far", prompt, predicted - 40)
    assert learned.too_large == 1
