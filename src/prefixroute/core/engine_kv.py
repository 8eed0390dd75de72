"""A replica's index sized from the KV cache its engine reports.

In approximate and token mode the router cannot see a replica's evictions: its index forgets a
replica's prefixes at a capacity, ``index_capacity_blocks`` (16,384 blocks by default), one
figure for every replica. Real KV caches range from ten thousand tokens (a small GPU, a long
context model, vLLM on a CPU) to millions (an 8-GPU node). An index larger than its replica's
cache predicts hits on prefixes the replica has evicted (requests sent there for nothing, and
every such answer a stale prediction); one smaller than the cache forgets prefixes the replica
still holds, and their whole recomputation goes elsewhere. The simulator gives its router each
replica's true KV size; told 4x that size instead, the default policy's p99 TTFT on multi-turn
went from 248 to 320 ms and a third of its predictions were too high (docs/results.md,
"Learning how much each replica keeps").

vLLM and SGLang say how many tokens their KV cache holds (gateway/_scrape.py). So a front end
that scrapes them tells the router: :func:`index_blocks_for` converts tokens to the index's
blocks (routing blocks of token ids, or of characters at the model's learned characters per
token), and ``Router.size_index`` resizes (the least recently used entries go first when it
shrinks, counted as evictions). The gateway grows an index this way at once, and shrinks it
below its configured size only on a size it can trust: token mode, or a characters-per-token
estimate with enough answers behind it (gateway/_index_size.py: an index sized at a wrong ratio
forgets held prefixes; one several times the cache sends requests after evicted ones; both
measured). A replica whose index is unbounded is left alone: precise mode (the engine reports
every eviction) and an operator who asked for no bound. Where learning is on
(:mod:`prefixroute.core.index_capacity`), the new size becomes its upper bound and the learning
starts again from it.
"""

from __future__ import annotations

from prefixroute.core.errors import ConfigError


def index_blocks_for(kv_tokens: int, block_units: int, chars_per_token: float | None) -> int:
    """Index blocks that hold ``kv_tokens`` engine tokens: blocks of ``block_units`` token ids
    (``chars_per_token`` None), or of ``block_units`` characters at ``chars_per_token``. At
    least one."""
    if kv_tokens < 0 or block_units < 1 or (chars_per_token is not None and chars_per_token <= 0):
        raise ConfigError(
            f"index size: kv_tokens >= 0, block_units >= 1, chars_per_token > 0; got "
            f"{kv_tokens}, {block_units}, {chars_per_token}"
        )
    tokens_per_block = block_units if chars_per_token is None else block_units / chars_per_token
    return max(1, round(kv_tokens / tokens_per_block))
