"""Each replica's prefix index sized to the KV cache its engine reports.

The health round scrapes each replica's ``/metrics``; where the engine says how many tokens its
KV cache holds (gateway/_scrape.py), the replica's index keeps that many tokens' worth of blocks
(core/engine_kv.py says why). In token mode an index block is ``kv_block_size`` token
ids; in approximate mode ``block_chars`` characters, at the learned characters per token of the
model the replica serves (the estimate with the most answers behind it), so the size follows
that estimate as it is learned; it is set again when it moves by more than
``RESIZE_TOLERANCE`` (the estimate wanders by a few percent).

**Grown at once; shrunk only on a size it can trust.** An index smaller than its replica's
cache forgets prefixes the replica still holds, each a whole recomputation elsewhere; one
larger predicts hits the replica has evicted, and under load those cost more than the prompt's
recomputation: a request is sent behind a queue on the strength of a hit that is not there, its
TTFT is under-predicted, and the speed model reads the difference as a slower replica. So the
engine's size replaces the configured one both ways once it is known in index blocks: in token
mode at once, in approximate mode once the model's characters per token rest on
``MIN_ANSWERS`` answers. Until then (the prior 4 characters a token can be 3x off) it only
raises the configured size. Measured live (2026-12-03, 4 emulated replicas, multi-turn, 80
conversations): with 16,384 tokens of KV cache per replica, an index sized *down* at the prior
(a third of the cache: the workload's text runs at 12 characters a token) computed 2.03x the
floor at a 59.9% hit rate and 214 ms p99, the configured 16,384 blocks (16x the cache) 1.28x,
74.7% and 167 ms; with 65,536 tokens of cache and the index configured at 1,024 blocks, growing
it to the cache took 1.67x, 67.1% and 187 ms to 1.06x, 79.1% and 104 ms. On replicas written by
others with 65,536 tokens of cache and a tokenizer of 3-character pieces (2026-12-04,
``benchmarks/foreign_replica_b.py``, half the fleet 4x slower, multi-turn, 100 conversations),
the configured 16,384 blocks (about 6x the cache) had 47% of the fast pair's predictions too
high, 2.39-2.43x the floor and a p99 of 3.4-4.2 s; sized to the cache, 5.5% too high, 2.22x and
1.9 s (docs/results.md, "A second replica written by others"). Precise mode and an unbounded
index are left alone; so is everything with ``index_capacity_from_engine = false``.
"""

from __future__ import annotations

import logging

from prefixroute.core import ReplicaId, index_blocks_for
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._registry import ReplicaRecord, ReplicaRegistry

log = logging.getLogger(__name__)

RESIZE_TOLERANCE = 0.05  # relative change of the computed size that resizes the index again
# Answers behind a model's characters per token before the engine's size may shrink an index:
# as many as the speed model wants before its estimates are its own (min_observations).
MIN_ANSWERS = 8


class IndexSizer:
    """Sizes each replica's index to its engine's reported KV cache (module docstring)."""

    def __init__(self, registry: ReplicaRegistry, config: GatewayConfig) -> None:
        self.registry = registry
        self.config = config
        self._set: dict[ReplicaId, int] = {}  # the size last set per replica, blocks
        self._logged: set[ReplicaId] = set()  # replicas whose first sizing was logged at info
        # A replica removed and added again starts at the configured size: size it afresh.
        registry.on_removed(self._forget)

    def _forget(self, rid: ReplicaId) -> None:
        self._set.pop(rid, None)
        self._logged.discard(rid)

    def observe(self, record: ReplicaRecord, kv_tokens: int) -> None:
        """``record``'s engine holds ``kv_tokens`` tokens of KV cache."""
        cfg, router = self.config, self.registry.router
        if not cfg.index_capacity_from_engine or router.index_size(record.id) is None:
            return  # off, or unbounded: precise mode, or no bound configured
        if cfg.tokenizer is not None:  # token mode: blocks of token ids, exact
            blocks = index_blocks_for(kv_tokens, cfg.kv_block_size, None)
            trusted = True
        else:
            ratio, answers = self._chars_per_token(record)
            blocks = index_blocks_for(kv_tokens, cfg.block_chars, ratio)
            trusted = answers >= MIN_ANSWERS
        if not trusted:  # only grown while the ratio is the prior's (module docstring)
            blocks = max(blocks, cfg.index_capacity_blocks or 1)
        last = self._set.get(record.id, cfg.index_capacity_blocks)
        if last is not None and abs(blocks - last) <= RESIZE_TOLERANCE * last:
            return
        dropped = router.size_index(record.id, blocks)
        self._set[record.id] = blocks
        level = logging.INFO if record.id not in self._logged else logging.DEBUG
        self._logged.add(record.id)
        log.log(
            level, "replica %s: its engine's KV cache holds %d tokens; its index keeps %d blocks "
            "(%d entries dropped to fit)", record.url, kv_tokens, blocks, dropped or 0,
        )  # fmt: skip

    def _chars_per_token(self, record: ReplicaRecord) -> tuple[float, int]:
        """The learned characters per token of the model ``record`` serves, and the answers
        behind it: the estimate with the most answers among its base models and requests that
        named none (the prior, with 0, when none has any)."""
        router = self.registry.router
        learned = router.chars_per_token()
        names = [*sorted((record.models or frozenset()) - record.adapters), None]
        seen = [(learned[n].observations, n) for n in names if n in learned]
        answers, best = max(seen, key=lambda pair: pair[0]) if seen else (0, None)
        return router.chars_per_token_of(best), answers
