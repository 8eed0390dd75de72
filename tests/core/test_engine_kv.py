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
    # The least of each input: one token id a block; under a character a token (CJK in byte
    # BPEs), a 64-character block holds 128 tokens at 0.5.
    assert index_blocks_for(100, 1, None) == 100
    assert index_blocks_for(640, 64, 0.5) == 5
    assert index_blocks_for(640, 64, 1.0) == 10
    with pytest.raises(ConfigError, match="block_units >= 1.*got 100, 0, None"):
        index_blocks_for(100, 0, None)
    with pytest.raises(ConfigError, match="chars_per_token > 0"):
        index_blocks_for(100, 64, 0.0)
    with pytest.raises(ConfigError, match="kv_tokens >= 0"):
        index_blocks_for(-1, 64, None)


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
    with pytest.raises(ConfigError, match="at least one block, got 0"):
        router().size_index(R, 0)


def test_a_models_characters_per_token_as_learned_or_the_prior() -> None:
    r = router()
    assert r.chars_per_token_of("m") == r.chars_per_token_of(None) == 4.0  # the prior
    r.route(r.view("q", text="x" * 600, model="m"), 0.0)
    r.observe_usage("q", prompt_tokens=100, cached_tokens=None)  # 6 characters a token
    r.complete("q", 1.0)
    assert 4.0 < r.chars_per_token_of("m") <= 6.0
    assert r.chars_per_token_of(None) == 4.0  # another model's estimate, untouched


def test_learning_starts_again_under_the_engines_size() -> None:
    r = router(capacity=IndexCapacityConfig(learn=True))
    learned = r.index_capacity(R)
    assert learned is not None and learned.configured == 100
    r.size_index(R, 40)
    learned = r.index_capacity(R)
    assert learned is not None and learned.configured == 40 and learned.blocks == 40.0
