"""One replica's KV events applied to the router's prefix index, keyed by OUR hashes.

We never reproduce an engine's hash function (vLLM's depends on its version, its hash algorithm
and ``PYTHONHASHSEED``). A ``BlockStored`` event carries the token ids of the blocks it stores
and the engine hash of the block before them, so we hash the token ids with the router's own
:class:`BlockHasher`, chained from our hash of that parent block. A request routed later hashes
its prompt's token ids the same way, so its hashes meet the engine's blocks in the index.

The engine hash -> our hash map (one per replica) resolves parents and translates
``BlockRemoved`` events. An event whose parent we never saw (we joined the stream late, lost
batches, or skipped the parent) cannot be placed in a chain: its blocks are counted as orphans
and left out, which under-predicts, never over-predicts.

**Chains remembered across a clear.** A gap, a restart or an error clears the replica, and
with it the map. A prefix the engine keeps cached the whole time (a shared system prompt, never
evicted) is then never stored again, so every later block under it was an orphan for good (an
outside audit, 2026-12-06: 0 of 33 blocks matched after one lost batch). So a clear keeps what
the map held, each block with its parent (up to ``REMEMBERED`` blocks), and a new store that
names a remembered block as its parent brings that block's chain back: an engine caches a block
only under its parent (the request that stores it holds the whole chain at that moment), so the
parent and every block above it are held now, whatever was lost meanwhile.

A LoRA adapter's blocks are keyed by the adapter, as the request side keys that adapter's
requests (``Router.view(..., adapter=)``, :meth:`BlockHasher.for_adapter`): vLLM names the
adapter in ``lora_name`` (the name it serves the adapter under, which requests give as their
``model``) and puts the same name in every block's extra keys, so a stored event whose extra
keys hold nothing else maps to the adapter's key space. An event with ``lora_id`` and no
``lora_name`` (vLLM before it hashed names) is left out: the id is the engine's own number for
the adapter, which no API maps to the model name requests use.

Blocks that tokens (and the adapter) do not identify are left out too: another medium than the
GPU cache (CPU or storage offload tiers), and other extra keys (multimodal inputs, cache salt),
whose hashes differ from a plain prompt's with the same tokens. So are blocks of another block
size than ours: the request side could never produce their keys. Of a hybrid model's KV-cache
groups only group 0 is indexed, its removals included: the groups report the same engine hash
for the same tokens, and a sliding-window group evicts blocks the full-attention group keeps.

Copies: an engine may hold two physical blocks with one hash (two requests computed the same
prefix at once) and report each eviction. We keep one entry per hash, so the first eviction
removes it while a copy may remain: again an under-prediction, and rare in vLLM v1, which
caches blocks when it schedules them.

The blocks go to the router through its engine-event methods (``Router.engine_stored`` and
its siblings), so every change to the routing state stays a Router method. A bare
:class:`~prefixroute.core.PrefixIndex` works too (tests, benchmarks, an observer that routes
nothing), through :class:`IndexTarget`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prefixroute.core import BlockHash, BlockHasher, ConfigError, PrefixIndex, ReplicaId
from prefixroute.events._wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEventBatch,
)

log = logging.getLogger(__name__)

REMEMBERED = 1 << 18  # blocks kept across clears for their chains (module docstring)
Mapped = tuple[BlockHash, ExternalBlockHash | None]  # our hash, its parent's engine hash


@dataclass(slots=True)
class IndexerStats:
    """Counts since creation, for /metrics."""

    stored_events: int = 0  # BlockStored events received
    removed_events: int = 0  # BlockRemoved events received
    cleared_events: int = 0  # AllBlocksCleared events received
    stored_blocks: int = 0  # blocks indexed from BlockStored
    removed_blocks: int = 0  # blocks dropped on BlockRemoved
    orphan_blocks: int = 0  # stored blocks whose parent we never saw: not indexed
    skipped_blocks: int = 0  # stored blocks tokens do not identify (medium, keys, size)
    wrong_size_blocks: int = 0  # of the skipped, those in blocks of another size than ours
    adapter_blocks: int = 0  # of the stored blocks, those indexed under a LoRA adapter's key
    unknown_removals: int = 0  # BlockRemoved for a hash we do not hold
    recalled_blocks: int = 0  # blocks brought back from before a clear by a store under them
    repeated_blocks: int = 0  # stored blocks already held: reported again, nothing changed


class EngineBlocks(Protocol):
    """What the indexer tells: a replica's engine stored, evicted or dropped blocks (our
    hashes). :class:`~prefixroute.core.Router` is one; :class:`IndexTarget` another."""

    def engine_stored(
        self, replica: ReplicaId, block_hashes: Sequence[BlockHash], *, from_root: bool = True
    ) -> None: ...

    def engine_removed(self, replica: ReplicaId, block_hashes: Iterable[BlockHash]) -> None: ...

    def engine_cleared(self, replica: ReplicaId, emptied: bool = False) -> None: ...


class IndexTarget:
    """A bare prefix index told what an engine reports, as the Router tells its own."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    def engine_stored(
        self, replica: ReplicaId, block_hashes: Sequence[BlockHash], *, from_root: bool = True
    ) -> None:
        if replica in self.index.replicas:  # a replica removed meanwhile stays removed
            self.index.insert(replica, block_hashes, from_root=from_root)

    def engine_removed(self, replica: ReplicaId, block_hashes: Iterable[BlockHash]) -> None:
        self.index.remove_blocks(replica, block_hashes)

    def engine_cleared(self, replica: ReplicaId, emptied: bool = False) -> None:
        self.index.clear_replica(replica)


class PreciseIndexer:
    """Keeps ``replica``'s entries in the router's index (or a bare ``index``) equal to what
    its engine reported."""

    def __init__(
        self, replica: ReplicaId, target: EngineBlocks | PrefixIndex, hasher: BlockHasher
    ) -> None:
        self.replica = replica
        if isinstance(target, PrefixIndex):
            target = IndexTarget(target)
        self.target = target
        self.hasher = hasher
        self.stats = IndexerStats()
        # engine hash -> (our hash, its parent's engine hash): now, and before a clear
        self._ours: dict[ExternalBlockHash, Mapped] = {}
        self._before: dict[ExternalBlockHash, Mapped] = {}
        self._warned_size = False

    def apply(self, batch: KVEventBatch) -> None:
        """Apply a batch's events in order."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                self._removed(event)
            else:
                assert isinstance(event, AllBlocksCleared)
                self.stats.cleared_events += 1
                self.clear(remember=False)  # truly empty: what it holds next, it stores again

    def clear(self, remember: bool = True) -> None:
        """Forget everything this replica reported (a gap, a restart, an error), remembering
        each block's chain for a later store under it (module docstring); ``remember=False``:
        the engine emptied its cache (``AllBlocksCleared``), so nothing from before is held."""
        if not remember or len(self._before) + len(self._ours) > REMEMBERED:
            self._before.clear()  # the older memory goes first
        if remember:
            self._before.update(self._ours)
        self._ours.clear()
        self.target.engine_cleared(self.replica, emptied=not remember)

    def __len__(self) -> int:
        """Engine blocks currently mapped."""
        return len(self._ours)

    @property
    def index(self) -> PrefixIndex | None:
        """The bare index it feeds; None when it feeds a router (read the router instead)."""
        return self.target.index if isinstance(self.target, IndexTarget) else None

    # --- events ---------------------------------------------------------------------------
    def _stored(self, event: BlockStored) -> None:
        stats = self.stats
        stats.stored_events += 1
        n = len(event.block_hashes)
        if not n:  # stores nothing (vLLM never sends one; its parents list below would not fit)
            return
        if self._held(event):  # a report again (gateway/_kv_report.py): nothing to hash
            stats.repeated_blocks += n
            return
        hasher = self._hasher_of(event)
        if hasher is None:
            stats.skipped_blocks += n
            return
        parent: BlockHash | None = None
        if event.parent_block_hash is not None:
            mapped = self._ours.get(event.parent_block_hash)
            parent = mapped[0] if mapped is not None else self._recall(event.parent_block_hash)
            if parent is None:
                stats.orphan_blocks += n
                return
        try:
            ours = hasher.hash_tokens(event.token_ids, parent=parent)
        except ConfigError:  # ids outside [0, 2**32): they decode, but no prompt has them
            stats.skipped_blocks += n
            return
        if len(ours) != n or len(event.token_ids) != n * hasher.block_size:  # counts disagree
            stats.skipped_blocks += n
            return
        parents = [event.parent_block_hash, *event.block_hashes[:-1]]
        self._ours.update(zip(event.block_hashes, zip(ours, parents, strict=True), strict=True))
        self.target.engine_stored(self.replica, ours, from_root=parent is None)
        stats.stored_blocks += n
        if event.lora_name is not None:
            stats.adapter_blocks += n

    def _held(self, event: BlockStored) -> bool:
        """Every block of ``event`` is mapped already, under the same parents."""
        parent, ours = event.parent_block_hash, self._ours
        for engine_hash in event.block_hashes:
            mapped = ours.get(engine_hash)
            if mapped is None or mapped[1] != parent:
                return False
            parent = engine_hash
        return True

    def _removed(self, event: BlockRemoved) -> None:
        stats = self.stats
        stats.removed_events += 1
        # Only the removals of what we index: another medium's copy, or another KV-cache
        # group's (a hybrid model's sliding-window group evicts blocks the full-attention
        # group keeps, under the same group-less engine hash), leaves our block in place.
        if not _indexed(event):
            return
        ours: list[BlockHash] = []
        for engine_hash in event.block_hashes:
            mapped = self._ours.pop(engine_hash, None)
            self._before.pop(engine_hash, None)  # evicted: no store can name it as held
            if mapped is None:
                stats.unknown_removals += 1
            else:
                ours.append(mapped[0])
        if ours:
            self.target.engine_removed(self.replica, ours)
            stats.removed_blocks += len(ours)

    def _recall(self, engine_hash: ExternalBlockHash) -> BlockHash | None:
        """Our hash of a block forgotten at a clear that a new store names as its parent, its
        chain back in the index (module docstring); None when a link of it is not known."""
        chain: list[tuple[ExternalBlockHash, Mapped]] = []
        link: ExternalBlockHash | None = engine_hash
        while link is not None and link not in self._ours:
            entry = self._before.get(link)
            if entry is None or len(chain) > len(self._before):  # unknown, or a loop
                return None
            chain.append((link, entry))
            link = entry[1]
        chain.reverse()  # root (or the block we hold) first
        self._ours.update(chain)
        self.target.engine_stored(self.replica, [m[0] for _, m in chain], from_root=link is None)
        self.stats.recalled_blocks += len(chain)
        return self._ours[engine_hash][0]

    def _hasher_of(self, event: BlockStored) -> BlockHasher | None:
        """The hasher that keys ``event``'s blocks as requests are keyed: ours, or ours in
        its LoRA adapter's space; None when tokens and adapter do not identify them."""
        if not self._identified_by_tokens(event):
            return None
        lora = event.lora_name
        return self.hasher if lora is None else self.hasher.for_adapter(lora)

    def _identified_by_tokens(self, event: BlockStored) -> bool:
        # Medium and group first: only a GPU block of the indexed group tells the engine's
        # block size. vLLM's CPU offloading publishes placeholder stores with block_size=0
        # (offloading/events.py, _placeholder_stored), and another group (Mamba, say) may use
        # another size: neither is a misconfiguration, and neither may spend the one warning.
        if not _indexed(event):
            return False
        if event.block_size != self.hasher.block_size:
            self.stats.wrong_size_blocks += len(event.block_hashes)
            self._warn_block_size(event.block_size)
            return False
        lora = event.lora_name
        adapter_key = (lora,) if lora is not None else None
        return (lora is not None or event.lora_id is None) and (
            event.extra_keys is None
            or all(k is None or tuple(k) == adapter_key for k in event.extra_keys)
        )

    def _warn_block_size(self, block_size: int) -> None:
        if not self._warned_size:
            self._warned_size = True
            log.error(
                "replica %s reports %d-token blocks but the gateway hashes %d-token "
                "blocks: its events cannot match requests (set the KV block size)",
                self.replica,
                block_size,
                self.hasher.block_size,
            )


def _indexed(event: BlockStored | BlockRemoved) -> bool:
    """Whether ``event`` is about blocks we index: the GPU cache (no medium: engines that
    predate tiers), and KV-cache group 0 (a model's only group, or a hybrid model's first; no
    group: engines that predate groups)."""
    return event.medium in (None, MEDIUM_GPU) and event.group_idx in (None, 0)
