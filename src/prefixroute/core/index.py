"""The approximate prefix index: which replica holds which block, aged like the replicas' caches.

The router cannot see a replica's KV cache, so it keeps its own picture: every routing decision
inserts the request's blocks for the chosen replica, and each replica's entries live in an LRU
with the replica's capacity in blocks, so the picture forgets blocks at about the rate the
replica evicts them.

Why not an ``OrderedDict`` per replica: touching a 512-block chain block by block costs ~0.2 ms
in Python, on every request. Instead each replica has

* ``stamps``: block hash -> tick of its last touch, written for a whole chain in one C-level
  ``dict.update`` (ticks only go up);
* ``queue``: the touches in tick order, one ``(hashes, ticks)`` entry per insert, consumed
  lazily by eviction: an entry's block is evicted only if its stamp still equals the entry's tick
  (a later touch made it stale), as vLLM's block pool evicts lazily.

A chain is stamped from its last block to its first, so a parent is always more recent than its
children and eviction takes leaves first. Each replica's set of blocks is therefore closed under
prefixes, and the longest match is found by binary search: a dozen probes per replica instead of a
walk over every block. Removing single blocks or inserting a chain that does not start at the root
(engine events) can break that closure, so such a replica is matched by a linear walk until it is
cleared.

Stale queue entries are dropped when eviction reaches them; when no eviction happens for long,
the queue is compacted once it holds four times the live entries, so memory stays bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prefixroute.core.errors import ConfigError
from prefixroute.core.hashing import BlockHash
from prefixroute.core.types import ReplicaId

COMPACT_FACTOR = 4  # compact a replica's queue when it holds this many times its live entries
COMPACT_MIN = 4096  # ... and at least this many entries, entries


@dataclass(slots=True)
class _ReplicaEntries:
    capacity: int | None  # blocks; None = unbounded
    stamps: dict[BlockHash, int] = field(default_factory=dict)  # hash -> tick of last touch
    queue: deque[tuple[Sequence[BlockHash], range | list[int]]] = field(default_factory=deque)
    queued: int = 0  # hashes referenced by ``queue`` (live or stale)
    cursor: int = 0  # position reached in ``queue[0]`` by eviction
    tick: int = 0  # next tick to hand out
    gapped: bool = False  # blocks were removed individually: prefix closure not guaranteed


class PrefixIndex:
    """Block hash -> replicas, with a per-replica LRU capacity in blocks."""

    def __init__(self, default_capacity_blocks: int | None = None) -> None:
        if default_capacity_blocks is not None and default_capacity_blocks < 1:
            raise ConfigError(
                f"index capacity must be at least 1 block, got {default_capacity_blocks}"
            )
        self.default_capacity_blocks = default_capacity_blocks  # blocks; None = unbounded
        self._replicas: dict[ReplicaId, _ReplicaEntries] = {}
        self.evictions = 0  # entries dropped by LRU capacity, all replicas, since creation

    # --- replicas -------------------------------------------------------------------------
    def add_replica(self, replica: ReplicaId, capacity_blocks: int | None = None) -> None:
        """Register ``replica`` (idempotent). ``capacity_blocks`` overrides the default."""
        if replica in self._replicas:
            return
        cap = capacity_blocks if capacity_blocks is not None else self.default_capacity_blocks
        if cap is not None and cap < 1:
            raise ConfigError(f"index capacity must be at least 1 block, got {cap}")
        self._replicas[replica] = _ReplicaEntries(cap)

    def remove_replica(self, replica: ReplicaId) -> None:
        """Forget ``replica`` and every entry it held."""
        self._replicas.pop(replica, None)

    def clear_replica(self, replica: ReplicaId) -> None:
        """Drop every entry of ``replica`` but keep it registered (an engine cleared its cache)."""
        old = self._replicas.get(replica)
        if old is not None:
            self._replicas[replica] = _ReplicaEntries(old.capacity)

    @property
    def replicas(self) -> list[ReplicaId]:
        return list(self._replicas)

    # --- updates --------------------------------------------------------------------------
    def insert(
        self, replica: ReplicaId, block_hashes: Sequence[BlockHash], *, from_root: bool = True
    ) -> int:
        """Record that ``replica`` now holds this chain; returns how many entries were evicted.

        ``from_root`` says the chain starts at a prompt's first block, as every routing decision
        does. Engine events name only newly stored blocks, which continue an earlier chain: pass
        ``from_root=False`` and the replica is matched by a linear walk from then on, because
        stamping a continuation can leave a child more recent than its parent.
        """
        entries = self._replicas.get(replica)
        if entries is None:
            self.add_replica(replica)
            entries = self._replicas[replica]
        n = len(block_hashes)
        if not n:
            return 0
        if not from_root:
            entries.gapped = True
        tail_first = block_hashes[::-1]
        ticks = range(entries.tick, entries.tick + n)
        entries.tick += n
        entries.stamps.update(zip(tail_first, ticks, strict=True))
        if entries.capacity is None:
            return 0  # nothing will ever be evicted: no need to remember the order
        entries.queue.append((tail_first, ticks))
        entries.queued += n
        evicted = self._evict(entries)
        if entries.queued > COMPACT_FACTOR * len(entries.stamps) + COMPACT_MIN:
            self._compact(entries)
        self.evictions += evicted
        return evicted

    @staticmethod
    def _evict(entries: _ReplicaEntries) -> int:
        """Drop least recently touched entries until the replica is within capacity."""
        stamps, queue, cap = entries.stamps, entries.queue, entries.capacity
        assert cap is not None
        evicted = 0
        while len(stamps) > cap:
            hashes, ticks = queue[0]
            i, end = entries.cursor, len(hashes)
            while i < end and len(stamps) > cap:
                h = hashes[i]
                if stamps.get(h) == ticks[i]:
                    del stamps[h]
                    evicted += 1
                i += 1
            if i == end:
                queue.popleft()
                entries.queued -= end
                entries.cursor = 0
            else:
                entries.cursor = i
        return evicted

    @staticmethod
    def _compact(entries: _ReplicaEntries) -> None:
        """Rebuild the queue from the live stamps alone, in tick order."""
        live = sorted(entries.stamps.items(), key=lambda kv: kv[1])
        entries.queue.clear()
        entries.queue.append(([h for h, _ in live], [t for _, t in live]))
        entries.queued = len(live)
        entries.cursor = 0

    def remove_blocks(self, replica: ReplicaId, block_hashes: Iterable[BlockHash]) -> None:
        """Drop specific entries of ``replica`` (the engine reported them evicted)."""
        entries = self._replicas.get(replica)
        if entries is None:
            return
        stamps = entries.stamps
        for h in block_hashes:
            if stamps.pop(h, None) is not None:
                entries.gapped = True

    # --- queries --------------------------------------------------------------------------
    def match(
        self, block_hashes: Sequence[BlockHash], replicas: Iterable[ReplicaId] | None = None
    ) -> dict[ReplicaId, int]:
        """Longest cached prefix per replica, in blocks; replicas matching nothing are absent."""
        result: dict[ReplicaId, int] = {}
        n = len(block_hashes)
        if not n:
            return result
        first, last = block_hashes[0], block_hashes[-1]
        pool = self._replicas if replicas is None else replicas
        for replica in pool:
            entries = self._replicas.get(replica)
            if entries is None:
                continue
            stamps = entries.stamps
            if first not in stamps:
                continue
            if entries.gapped:
                m = 1
                while m < n and block_hashes[m] in stamps:
                    m += 1
            elif last in stamps:
                m = n
            else:  # hashes[lo - 1] is held, hashes[hi] is not
                lo, hi = 1, n - 1
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if block_hashes[mid] in stamps:
                        lo = mid + 1
                    else:
                        hi = mid
                m = lo
            result[replica] = m
        return result

    def blocks_of(self, replica: ReplicaId) -> int:
        """Entries currently held for ``replica``, in blocks."""
        entries = self._replicas.get(replica)
        return len(entries.stamps) if entries is not None else 0

    def holds(self, replica: ReplicaId, block_hash: BlockHash) -> bool:
        entries = self._replicas.get(replica)
        return entries is not None and block_hash in entries.stamps

    def __len__(self) -> int:
        """Distinct block hashes indexed (a block held by 3 replicas counts once). O(entries)."""
        if len(self._replicas) == 1:
            return self.entries
        return len(set().union(*(e.stamps for e in self._replicas.values())))

    @property
    def entries(self) -> int:
        """(replica, block) entries, i.e. the sum of every replica's LRU size."""
        return sum(len(e.stamps) for e in self._replicas.values())
