"""The approximate prefix index: which replica holds which block, aged like the replicas' caches.

The router cannot see a replica's KV cache, so it keeps its own picture: every routing decision
inserts the request's blocks for the chosen replica, and each replica's entries live in an LRU
with the replica's capacity in blocks, so the picture forgets blocks at about the rate the
replica evicts them.

Data model (chosen for memory and a fast match):

* ``_holders``: block hash -> bitmask of the replicas holding it (one int per block, not a set).
* ``_lru[slot]``: per replica, an ``OrderedDict`` used as an LRU (O(1) move-to-end and pop-oldest;
  a plain dict degrades when popped from the front).

A chain is touched from its last block to its first, so a parent is always at least as recent as
any of its children and eviction takes leaves first, as vLLM's free queue does. Matching still
walks block by block and never relies on that invariant, so removals from engine events (which
may drop a middle block) cannot produce a wrong match.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from prefixroute.core.errors import ConfigError
from prefixroute.core.hashing import BlockHash
from prefixroute.core.types import ReplicaId


class PrefixIndex:
    """Block hash -> replicas, with a per-replica LRU capacity in blocks."""

    def __init__(self, default_capacity_blocks: int | None = None) -> None:
        self.default_capacity_blocks = default_capacity_blocks  # blocks; None = unbounded
        self._holders: dict[BlockHash, int] = {}
        self._lru: dict[int, OrderedDict[BlockHash, None]] = {}
        self._capacity: dict[int, int | None] = {}
        self._slot_of: dict[ReplicaId, int] = {}
        self._replica_of: dict[int, ReplicaId] = {}
        self._free_slots: list[int] = []
        self.evictions = 0  # entries dropped by LRU capacity, all replicas, since creation

    # --- replicas -------------------------------------------------------------------------
    def add_replica(self, replica: ReplicaId, capacity_blocks: int | None = None) -> None:
        """Register ``replica`` (idempotent). ``capacity_blocks`` overrides the default."""
        if replica in self._slot_of:
            return
        cap = capacity_blocks if capacity_blocks is not None else self.default_capacity_blocks
        if cap is not None and cap < 1:
            raise ConfigError(f"index capacity must be at least 1 block, got {cap}")
        slot = self._free_slots.pop() if self._free_slots else len(self._slot_of)
        self._slot_of[replica] = slot
        self._replica_of[slot] = replica
        self._lru[slot] = OrderedDict()
        self._capacity[slot] = cap

    def remove_replica(self, replica: ReplicaId) -> None:
        """Forget ``replica`` and every entry it held."""
        slot = self._slot_of.pop(replica, None)
        if slot is None:
            return
        self._drop_entries(slot, list(self._lru.pop(slot)))
        del self._replica_of[slot], self._capacity[slot]
        self._free_slots.append(slot)

    def clear_replica(self, replica: ReplicaId) -> None:
        """Drop every entry of ``replica`` but keep it registered (an engine cleared its cache)."""
        slot = self._slot_of[replica]
        self._drop_entries(slot, list(self._lru[slot]))
        self._lru[slot].clear()

    @property
    def replicas(self) -> list[ReplicaId]:
        return list(self._slot_of)

    # --- updates --------------------------------------------------------------------------
    def insert(self, replica: ReplicaId, block_hashes: Sequence[BlockHash]) -> int:
        """Record that ``replica`` now holds this chain; returns how many entries were evicted."""
        slot = self._slot_of.get(replica)
        if slot is None:
            self.add_replica(replica)
            slot = self._slot_of[replica]
        bit = 1 << slot
        lru = self._lru[slot]
        holders = self._holders
        touch = lru.move_to_end
        for h in reversed(block_hashes):  # parents end up more recent than children
            if h in lru:
                touch(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        cap = self._capacity[slot]
        evicted = 0
        if cap is not None:
            while len(lru) > cap:
                old, _ = lru.popitem(last=False)
                self._unset(old, bit)
                evicted += 1
        self.evictions += evicted
        return evicted

    def remove_blocks(self, replica: ReplicaId, block_hashes: Iterable[BlockHash]) -> None:
        """Drop specific entries of ``replica`` (the engine reported them evicted)."""
        slot = self._slot_of.get(replica)
        if slot is None:
            return
        lru = self._lru[slot]
        doomed = [h for h in block_hashes if lru.pop(h, 0) is None]
        self._drop_entries(slot, doomed)

    def _drop_entries(self, slot: int, block_hashes: Iterable[BlockHash]) -> None:
        bit = 1 << slot
        for h in block_hashes:
            self._unset(h, bit)

    def _unset(self, h: BlockHash, bit: int) -> None:
        rest = self._holders[h] & ~bit
        if rest:
            self._holders[h] = rest
        else:
            del self._holders[h]

    # --- queries --------------------------------------------------------------------------
    def match(self, block_hashes: Sequence[BlockHash]) -> dict[ReplicaId, int]:
        """Longest cached prefix per replica, in blocks; replicas matching nothing are absent."""
        holders = self._holders
        result: dict[ReplicaId, int] = {}
        if not block_hashes:
            return result
        active = holders.get(block_hashes[0], 0)
        i = 0
        n = len(block_hashes)
        while active:
            i += 1
            nxt = holders.get(block_hashes[i], 0) if i < n else 0
            lost = active & ~nxt
            if lost:
                self._credit(result, lost, i)
                active &= nxt
        return result

    def _credit(self, result: dict[ReplicaId, int], mask: int, blocks: int) -> None:
        while mask:
            low = mask & -mask
            result[self._replica_of[low.bit_length() - 1]] = blocks
            mask ^= low

    def blocks_of(self, replica: ReplicaId) -> int:
        """Entries currently held for ``replica``, in blocks."""
        slot = self._slot_of.get(replica)
        return len(self._lru[slot]) if slot is not None else 0

    def holds(self, replica: ReplicaId, block_hash: BlockHash) -> bool:
        slot = self._slot_of.get(replica)
        return slot is not None and bool(self._holders.get(block_hash, 0) >> slot & 1)

    def __len__(self) -> int:
        """Distinct block hashes indexed (a block held by 3 replicas counts once)."""
        return len(self._holders)

    @property
    def entries(self) -> int:
        """(replica, block) entries, i.e. the sum of every replica's LRU size."""
        return sum(len(lru) for lru in self._lru.values())
