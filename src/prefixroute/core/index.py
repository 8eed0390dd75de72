"""The approximate prefix index: which replica holds which block, aged like the replicas' caches.

The router cannot see a replica's KV cache, so it keeps its own picture: every routing decision
inserts the request's blocks for the chosen replica, and each replica's entries live in an LRU
with the replica's capacity in blocks, so the picture forgets blocks at about the rate the
replica evicts them.

Why not an ``OrderedDict`` per replica: touching a 512-block chain block by block costs ~0.2 ms
in Python, on every request. Instead each replica has

* ``stamps``: block hash -> tick of its last touch, written for a whole chain in one C-level
  ``dict.update``; one tick per insert (ticks only go up), the same int object for every block,
  so a touch allocates nothing per block;
* ``queue``: the touches in tick order, one ``(hashes, tick)`` entry per insert with the chain
  tail first, consumed lazily by eviction: an entry's block is evicted only if its stamp still
  equals the entry's tick (a later touch made it stale), as vLLM's block pool evicts lazily.

Eviction walks an entry from the chain's last block to its first, and a parent touched later by
another chain has that chain's newer tick, so eviction takes leaves first. Each replica's set of
blocks is therefore closed under prefixes, and the longest match is found by binary search: a
dozen probes per replica instead of a walk over every block. Removing single blocks or inserting
a chain that does not start at the root (engine events) can break that closure, so such a
replica is matched by a linear walk until it is cleared.

Stale queue entries are dropped when eviction reaches them; when no eviction happens for long,
the queue is compacted once it holds four times the live entries, so memory stays bounded.

Clusters of hundreds of replicas add a *holder map* (switched on by the replica count): for every
``holder_stride``-th block of each chain inserted from the root, and its last block, the replicas
that hold it. :meth:`PrefixIndex.deepest_holders` walks a request's chain from its end and finds
the few replicas with the longest matches without visiting the others; a policy then scores those
plus a random sample instead of every replica (see ``RoutingContext.shortlist``). Block hashes are
chained, so a block at position ``i`` of a request is at position ``i`` of every chain that holds
it, and probing the same positions finds it. The map is cleaned lazily: a lookup drops holders that
evicted the block, and a sweep runs once the map has doubled since the last one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from prefixroute.core.errors import ConfigError
from prefixroute.core.hashing import BlockHash
from prefixroute.core.types import ReplicaId

COMPACT_FACTOR = 4  # compact a replica's queue when it holds this many times its live entries
COMPACT_MIN = 4096  # ... and at least this many entries, entries
HOLDER_MAP_REPLICAS = 64  # registering more replicas than this switches the holder map on
HOLDER_STRIDE = 16  # the holder map records every this-many-th block of a chain, blocks
HOLDER_SWEEP_MIN = 65_536  # sweep stale holders once the map grew this much since the last sweep


def held_prefix(
    block_hashes: Sequence[BlockHash], held: Container[BlockHash], known: int = 1
) -> int:
    """Blocks of ``block_hashes`` in ``held``, counted from the first, by binary search.

    ``held`` must be closed under prefixes (a held block's parent is held), and the first
    ``known`` blocks (``known`` >= 1) must be held: then the held blocks of the chain are a prefix
    of it, and a dozen probes find its end.
    """
    n = len(block_hashes)
    if block_hashes[-1] in held:
        return n
    lo, hi = known, n - 1  # block_hashes[lo - 1] is held, block_hashes[hi] is not
    while lo < hi:
        mid = (lo + hi) >> 1
        if block_hashes[mid] in held:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(slots=True)
class _ReplicaEntries:
    capacity: int | None  # blocks; None = unbounded
    stamps: dict[BlockHash, int] = field(default_factory=dict)  # hash -> tick of last touch
    queue: deque[tuple[Sequence[BlockHash], int]] = field(default_factory=deque)
    queued: int = 0  # hashes referenced by ``queue`` (live or stale)
    cursor: int = 0  # position reached in ``queue[0]`` by eviction
    tick: int = 0  # next tick to hand out
    gapped: bool = False  # blocks were removed individually: prefix closure not guaranteed


class PrefixIndex:
    """Block hash -> replicas, with a per-replica LRU capacity in blocks."""

    def __init__(
        self,
        default_capacity_blocks: int | None = None,
        *,
        holder_map: bool | None = None,
        holder_stride: int = HOLDER_STRIDE,
    ) -> None:
        """``holder_map``: True/False forces the holder map on/off; None (the default) switches
        it on once more than ``HOLDER_MAP_REPLICAS`` replicas are registered."""
        if default_capacity_blocks is not None and default_capacity_blocks < 1:
            raise ConfigError(
                f"index capacity must be at least 1 block, got {default_capacity_blocks}"
            )
        if holder_stride < 1:
            raise ConfigError(f"holder_stride must be at least 1 block, got {holder_stride}")
        self.default_capacity_blocks = default_capacity_blocks  # blocks; None = unbounded
        self._replicas: dict[ReplicaId, _ReplicaEntries] = {}
        self.evictions = 0  # entries dropped by LRU capacity, all replicas, since creation
        self._auto_holders = holder_map is None
        self.holder_stride = holder_stride
        # block hash -> replicas that inserted it at a probed position (may hold stale replicas)
        self._holders: dict[BlockHash, set[ReplicaId]] | None = {} if holder_map else None
        self._holder_adds = 0  # additions since the last sweep (an upper bound on its growth)
        self._holder_live = 0  # holder entries left by the last sweep
        self._gapped: set[ReplicaId] = set()  # replicas matched by a linear walk

    # --- replicas -------------------------------------------------------------------------
    def add_replica(self, replica: ReplicaId, capacity_blocks: int | None = None) -> None:
        """Register ``replica`` (idempotent). ``capacity_blocks`` overrides the default."""
        if replica in self._replicas:
            return
        cap = capacity_blocks if capacity_blocks is not None else self.default_capacity_blocks
        if cap is not None and cap < 1:
            raise ConfigError(f"index capacity must be at least 1 block, got {cap}")
        self._replicas[replica] = _ReplicaEntries(cap)
        if (
            self._auto_holders
            and self._holders is None
            and len(self._replicas) > HOLDER_MAP_REPLICAS
        ):
            self._build_holders()

    def remove_replica(self, replica: ReplicaId) -> None:
        """Forget ``replica`` and every entry it held."""
        self._replicas.pop(replica, None)
        self._gapped.discard(replica)

    def clear_replica(self, replica: ReplicaId) -> None:
        """Drop every entry of ``replica`` but keep it registered (an engine cleared its cache)."""
        old = self._replicas.get(replica)
        if old is not None:
            self._replicas[replica] = _ReplicaEntries(old.capacity)
            self._gapped.discard(replica)

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
            self._gapped.add(replica)
        elif self._holders is not None:
            self._add_holders(replica, block_hashes)
        tail_first = block_hashes[::-1]
        tick = entries.tick
        entries.tick += 1
        entries.stamps.update(zip(tail_first, repeat(tick)))
        if entries.capacity is None:
            return 0  # nothing will ever be evicted: no need to remember the order
        entries.queue.append((tail_first, tick))
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
            hashes, tick = queue[0]
            i, end = entries.cursor, len(hashes)
            while i < end and len(stamps) > cap:
                h = hashes[i]
                if stamps.get(h) == tick:
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
        """Drop the stale hashes from the queue, keeping its order (leaves first within a tick)."""
        stamps, old = entries.stamps, entries.queue
        queue: deque[tuple[Sequence[BlockHash], int]] = deque()
        queued = 0
        for k, (hashes, tick) in enumerate(old):
            live = [h for h in (hashes[entries.cursor :] if k == 0 else hashes)
                    if stamps.get(h) == tick]  # fmt: skip
            if live:
                queue.append((live, tick))
                queued += len(live)
        entries.queue = queue
        entries.queued = queued
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
                self._gapped.add(replica)

    # --- queries --------------------------------------------------------------------------
    def match(
        self, block_hashes: Sequence[BlockHash], replicas: Iterable[ReplicaId] | None = None
    ) -> dict[ReplicaId, int]:
        """Longest cached prefix per replica, in blocks; replicas matching nothing are absent."""
        result: dict[ReplicaId, int] = {}
        if not block_hashes:
            return result
        first = block_hashes[0]
        pool = self._replicas if replicas is None else replicas
        for replica in pool:
            entries = self._replicas.get(replica)
            if entries is None or first not in entries.stamps:
                continue
            result[replica] = self._match_one(entries, block_hashes, 1)
        return result

    @staticmethod
    def _match_one(entries: _ReplicaEntries, block_hashes: Sequence[BlockHash], held: int) -> int:
        """Matched blocks of one replica known to hold the first ``held`` blocks (``held`` >= 1)."""
        stamps = entries.stamps
        n = len(block_hashes)
        if entries.gapped:
            m = 1
            while m < n and block_hashes[m] in stamps:
                m += 1
            return m
        return held_prefix(block_hashes, stamps, held)

    # --- the holder map (large clusters) --------------------------------------------------
    @property
    def has_holder_map(self) -> bool:
        return self._holders is not None

    @property
    def gapped_replicas(self) -> frozenset[ReplicaId]:
        """Replicas the holder map cannot see (their chains did not all start at the root)."""
        return frozenset(self._gapped)

    def _probes(self, n: int) -> list[int]:
        """Positions of an ``n``-block chain (n >= 1) that the holder map records, first to last:
        every ``holder_stride``-th block and the last one."""
        positions = list(range(0, n, self.holder_stride))
        if positions[-1] != n - 1:
            positions.append(n - 1)
        return positions

    def _add_holders(self, replica: ReplicaId, block_hashes: Sequence[BlockHash]) -> None:
        holders = self._holders
        assert holders is not None
        positions = self._probes(len(block_hashes))
        for i in positions:
            h = block_hashes[i]
            found = holders.get(h)
            if found is None:
                holders[h] = {replica}
            else:
                found.add(replica)
        self._holder_adds += len(positions)
        if self._holder_adds > self._holder_live + HOLDER_SWEEP_MIN:
            self._sweep_holders()

    def _build_holders(self) -> None:
        """Switch the holder map on: record every held block (positions are not known here)."""
        holders: dict[BlockHash, set[ReplicaId]] = {}
        for replica, entries in self._replicas.items():
            if entries.gapped:
                continue
            for h in entries.stamps:
                holders.setdefault(h, set()).add(replica)
        self._holders = holders
        self._holder_live = sum(len(s) for s in holders.values())
        self._holder_adds = 0

    def _sweep_holders(self) -> None:
        """Drop holders that no longer hold the block (evicted, cleared or removed)."""
        assert self._holders is not None
        reps = self._replicas
        live: dict[BlockHash, set[ReplicaId]] = {}
        count = 0
        for h, found in self._holders.items():
            keep = {r for r in found if (e := reps.get(r)) is not None and h in e.stamps}
            if keep:
                live[h] = keep
                count += len(keep)
        self._holders = live
        self._holder_live = count
        self._holder_adds = 0

    def deepest_holders(
        self, block_hashes: Sequence[BlockHash], limit: int
    ) -> dict[ReplicaId, int]:
        """The replicas with the longest matches, at most ``limit`` of them, with their matches.

        Walks the recorded positions of the chain from its last block to its first and takes
        every replica found at each position, whole positions only: it stops before the position
        whose holders would take it past ``limit``, or that records more than ``2 * limit`` holders
        beyond those found (live or stale; a prefix held by hundreds of replicas adds nobody and
        costs no pass over them). Gapped replicas are never returned (see
        :attr:`gapped_replicas`). Needs the holder map; the matches are exact, as :meth:`match`
        gives them.
        """
        holders = self._holders
        if holders is None:
            raise ConfigError("deepest_holders needs the holder map (holder_map=True)")
        n = len(block_hashes)
        found: dict[ReplicaId, int] = {}
        if not n or limit < 1:
            return found
        reps = self._replicas
        for i in reversed(self._probes(n)):
            h = block_hashes[i]
            at = holders.get(h)
            if not at:
                continue
            if len(at) > 2 * limit + len(found):
                break  # too many to take, stale ones or not: don't spend a pass over them
            level: list[tuple[ReplicaId, _ReplicaEntries]] = []
            stale: list[ReplicaId] = []
            for r in at:
                entries = reps.get(r)
                if entries is None or entries.gapped or h not in entries.stamps:
                    stale.append(r)
                elif r not in found:
                    level.append((r, entries))
            for r in stale:
                at.discard(r)
            if len(found) + len(level) > limit:
                break
            for r, entries in level:
                found[r] = self._match_one(entries, block_hashes, i + 1)
        return found

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
