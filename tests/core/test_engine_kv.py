"""A replica's index sized from its engine's KV cache (core/engine_kv.py, Router.size_index)."""

from __future__ import annotations

import pytest

from prefixroute.core import (
    BlockHasher,
    ConfigError,
    IndexCapacityConfig,
    ReplicaId,
    Router,
    index_blocks_for,
    make_policy,
)

R = ReplicaId("r")


def test_engine_tokens_in_the_index_blocks() -> None:
    # Token mode: blocks of 16 token ids.
    assert index_blocks_for(32_768, 16, None) == 2048
    # Approximate mode: 64 characters a block at 4 characters a token hold 16 tokens; at 2
    # characters a token (a tokenizer that cuts finer) they hold 32.
    assert index_blocks_for(32_768, 64, 4.0) == 2048
    assert index_blocks_for(32_768, 64, 2.0) == 1024
    assert index_blocks_for(0, 64, 4.0) == 1  # never an index of nothing
    assert index_blocks_for(24, 16, None) == 2  # to the nearest block: 1.5 rounds to 2
    assert index_blocks_for(40, 16, None) == 2  # 2.5 rounds to even
    with pytest.raises(ConfigError):
        index_blocks_for(100, 0, None)
    with pytest.raises(ConfigError):
        index_blocks_for(100, 64, 0.0)


def router(**kwargs: object) -> Router:
    r = Router(make_policy("predicted_ttft"), BlockHasher(block_size=4), index_capacity_blocks=100,
               **kwargs)  # type: ignore[arg-type]  # fmt: skip
    r.add_replica(R)
    return r


def fill(r: Router, blocks: int) -> None:
    """``blocks`` distinct blocks held by R, in prompts of 10 blocks."""
    for i in range(blocks // 10):
        view = r.view(f"q{i}", tokens=[i * 1000 + t for t in range(40)])
        r.route(view, 0.0)
        r.complete(f"q{i}", 1.0)


def test_sizing_shrinks_the_index_least_recent_first_and_grows_it() -> None:
    r = router()
    fill(r, 100)
    assert r.index_size(R) == 100 and r.indexed_blocks(R) == 100
    assert r.size_index(R, 30) == 70  # dropped to fit
    assert r.index_size(R) == 30 and r.indexed_blocks(R) == 30
    # The most recent prompts stay: the last one (q9) still matches whole, the first not at all.
    last = r.view("a", tokens=[9 * 1000 + t for t in range(40)])
    first = r.view("b", tokens=list(range(40)))
    assert r.index.match(last.block_hashes, [R])[R] == 10
    assert r.index.match(first.block_hashes, [R]).get(R, 0) == 0
    assert r.size_index(R, 500) == 0 and r.index_size(R) == 500
    assert r.size_index(R, 1) == 29 and r.index_size(R) == 1  # the least an index keeps
    r.size_index(R, 500)
    fill(r, 200)
    assert r.indexed_blocks(R) == 200  # room for all of them now


def test_an_unbounded_index_or_an_unknown_replica_is_left_alone() -> None:
    unbounded = Router(make_policy("predicted_ttft"), index_capacity_blocks=None)
    unbounded.add_replica(R)
    assert unbounded.size_index(R, 30) is None and unbounded.index_size(R) is None
    assert router().size_index(ReplicaId("other"), 30) is None
    with pytest.raises(ConfigError):
        router().size_index(R, 0)


def test_learning_starts_again_under_the_engines_size() -> None:
    r = router(capacity=IndexCapacityConfig(learn=True))
    learned = r.index_capacity(R)
    assert learned is not None and learned.configured == 100
    r.size_index(R, 40)
    learned = r.index_capacity(R)
    assert learned is not None and learned.configured == 40 and learned.blocks == 40.0
