"""Each replica's prefix index sized from the KV cache its engine reports.

The health round scrapes each replica's ``/metrics``; where the engine says how many tokens its
KV cache holds (gateway/_scrape.py), the replica's index keeps that many tokens' worth of
blocks instead of ``index_capacity_blocks`` (core/engine_kv.py says why). In token mode an
index block is ``kv_block_size`` token ids; in approximate mode ``block_chars`` characters, at
the replica's model's learned characters per token, so the size follows that estimate as it is
learned. The size is set again only when it moves by more than ``RESIZE_TOLERANCE``: the
estimate wanders by a few percent, and each shrink trims entries for good. Precise mode and an
unbounded index are left alone; so is everything with ``index_capacity_from_engine = false``.
"""

from __future__ import annotations

import logging

from prefixroute.core import ReplicaId, index_blocks_for
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._registry import ReplicaRecord, ReplicaRegistry

log = logging.getLogger(__name__)

RESIZE_TOLERANCE = 0.05  # relative change of the computed size that resizes the index again


class IndexSizer:
    """Sizes each replica's index from its engine's reported KV cache (module docstring)."""

    def __init__(self, registry: ReplicaRegistry, config: GatewayConfig) -> None:
        self.registry = registry
        self.config = config
        self._set: dict[ReplicaId, int] = {}  # the size last set per replica, blocks
        # A replica removed and added again starts at the configured size: size it afresh.
        registry.on_removed(self._forget)

    def _forget(self, rid: ReplicaId) -> None:
        self._set.pop(rid, None)

    def observe(self, record: ReplicaRecord, kv_tokens: int) -> None:
        """``record``'s engine holds ``kv_tokens`` tokens of KV cache."""
        cfg, router = self.config, self.registry.router
        if not cfg.index_capacity_from_engine or router.index_size(record.id) is None:
            return  # off, or unbounded: precise mode, or no bound configured
        if cfg.tokenizer is not None:  # token mode: blocks of token ids
            blocks = index_blocks_for(kv_tokens, cfg.kv_block_size, None)
        else:
            base = sorted((record.models or frozenset()) - record.adapters)
            per_token = router.chars_per_token_of(base[0] if base else None)
            blocks = index_blocks_for(kv_tokens, cfg.block_chars, per_token)
        last = self._set.get(record.id)
        if last is not None and abs(blocks - last) <= RESIZE_TOLERANCE * last:
            return
        dropped = router.size_index(record.id, blocks)
        self._set[record.id] = blocks
        level = logging.INFO if last is None else logging.DEBUG
        log.log(
            level, "replica %s: its engine's KV cache holds %d tokens; its index keeps %d blocks "
            "(%d entries dropped to fit)", record.url, kv_tokens, blocks, dropped or 0,
        )  # fmt: skip
