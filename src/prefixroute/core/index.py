"""The approximate prefix index: which replica holds which block, aged like the replicas' caches.

The router cannot see a replica's KV cache, so it keeps its own picture: every routing decision
inserts the request's blocks for the chosen replica, and each replica's entries live in an LRU
with the replica's capacity in blocks, so the picture forgets blocks at about the rate the
replica evicts them.

That LRU (:mod:`prefixroute.core._lru`, compiled when built) keeps each replica's set of blocks
closed under prefixes, so a longest match is a binary search of a dozen probes; a replica whose
closure an engine event may have broken is matched by a linear walk until it is cleared.

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

from collections.abc import Iterable, Sequence

from prefixroute.core import _native
from prefixroute.core._lru import LRU, lru_factory
from prefixroute.core._lru import held_prefix as held_prefix  # re-exported: speculative uses it
from prefixroute.core.errors import ConfigError
from prefixroute.core.hashing import BlockHash
from prefixroute.core.types import ReplicaId

HOLDER_MAP_REPLICAS = 64  # registering more replicas than this switches the holder map on
HOLDER_STRIDE = 16  # the holder map records every this-many-th block of a chain, blocks
HOLDER_SWEEP_MIN = 65_536  # sweep stale holders once the map grew this much since the last sweep


class PrefixIndex:
    """Block hash -> replicas, with a per-replica LRU capacity in blocks."""

    def __init__(
        self,
        default_capacity_blocks: int | None = None,
        *,
        holder_map: bool | None = None,
        holder_stride: int = HOLDER_STRIDE,
        compiled: bool = True,
    ) -> None:
        """``holder_map``: True/False forces the holder map on/off; None (the default) switches
        it on once more than ``HOLDER_MAP_REPLICAS`` replicas are registered. ``compiled``:
        each replica's LRU is the compiled one when it is built (False: the Python reference;
        the answers are the same)."""
        if default_capacity_blocks is not None and default_capacity_blocks < 1:
            raise ConfigError(
                f"index capacity must be at least 1 block, got {default_capacity_blocks}"
            )
        if holder_stride < 1:
            raise ConfigError(f"holder_stride must be at least 1 block, got {holder_stride}")
        self.default_capacity_blocks = default_capacity_blocks  # blocks; None = unbounded
        self._lru = lru_factory(compiled)  # one replica's entries
        # The calls over many LRUs at once, when the LRUs are the compiled ones: a decision's
        # matches, and the distinct blocks of all (None: the loops in Python below).
        native = self._lru is _native.LRU  # pragma: no mutate
        self._match_many = _native.match_each if native else None  # pragma: no mutate
        self._count_distinct = _native.distinct_blocks if native else None  # pragma: no mutate
        self._replicas: dict[ReplicaId, LRU] = {}
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
        self._replicas[replica] = self._lru(cap)
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
            self._replicas[replica] = self._lru(old.capacity)
            self._gapped.discard(replica)

    @property
    def replicas(self) -> list[ReplicaId]:
        return list(self._replicas)

    def capacity_of(self, replica: ReplicaId) -> int | None:
        """``replica``'s capacity in blocks (None: unbounded, or not registered)."""
        entries = self._replicas.get(replica)
        return entries.capacity if entries is not None else None

    def resize_replica(self, replica: ReplicaId, capacity_blocks: int) -> int:
        """Give a bounded ``replica`` a new capacity; returns the entries dropped to fit it, least
        recently used first (they count as evictions). Unregistered or unbounded: nothing."""
        entries = self._replicas.get(replica)
        if entries is None or entries.capacity is None:
            return 0
        dropped = entries.resize(capacity_blocks)
        self.evictions += dropped
        return dropped

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
        if not block_hashes:
            return 0
        # Held first, then recorded: recording may sweep the holder map, and a sweep keeps
        # only holders that hold their block, which this chain must already do.
        evicted = entries.touch(block_hashes)
        self.evictions += evicted
        if not from_root:
            entries.gapped = True
            self._gapped.add(replica)
        elif self._holders is not None:
            self._add_holders(replica, block_hashes)
        return evicted

    def remove_blocks(self, replica: ReplicaId, block_hashes: Iterable[BlockHash]) -> None:
        """Drop specific entries of ``replica`` (the engine reported them evicted)."""
        entries = self._replicas.get(replica)
        if entries is None:
            return
        for h in block_hashes:
            if entries.discard(h):
                entries.gapped = True
                self._gapped.add(replica)

    def mark(self, replica: ReplicaId) -> tuple[LRU, int]:
        """Where ``replica``'s entries (it must be registered) stand now, for :meth:`withdraw`
        to tell whether a chain was inserted there since."""
        entries = self._replicas[replica]
        return entries, entries.tick

    def withdraw(
        self, replica: ReplicaId, block_hashes: Sequence[BlockHash], since: tuple[LRU, int]
    ) -> int:
        """Take back ``block_hashes``, the tail of the chain inserted into ``replica`` just
        before the ``since`` mark that it added (held before: no), and return how many were
        still there. Nothing is taken when another chain was inserted there since (it may
        continue these blocks), the entries were cleared or replaced, or the replica is matched
        by a linear walk (its blocks after a gap may have been held before). Otherwise no held
        block continues these, so the set stays closed under prefixes."""
        entries = self._replicas.get(replica)
        if entries is None or entries.gapped or since != (entries, entries.tick):
            return 0
        return sum(entries.discard(h) for h in reversed(block_hashes))

    # --- queries --------------------------------------------------------------------------
    def match(
        self, block_hashes: Sequence[BlockHash], replicas: Iterable[ReplicaId] | None = None
    ) -> dict[ReplicaId, int]:
        """Longest cached prefix per replica, in blocks; replicas matching nothing are absent."""
        pool = self._replicas if replicas is None else replicas
        return {r: m for r, m in self.match_each(block_hashes, pool).items() if m}

    def match_each(
        self, block_hashes: Sequence[BlockHash], replicas: Iterable[ReplicaId]
    ) -> dict[ReplicaId, int]:
        """Longest cached prefix of each of ``replicas``, in blocks, in their order, 0 included
        (a policy's matches: one dict built once, not :meth:`match`'s then a copy with zeros).
        An unknown replica matches 0."""
        if not block_hashes:
            return dict.fromkeys(replicas, 0)
        get = self._replicas.get
        if self._match_many is not None:  # pragma: no mutate
            # Compiled LRUs: one call matches them all (each block's hash read once, not once
            # per replica); the same answers as the loop below.
            pool = list(replicas)  # pragma: no mutate
            found = self._match_many(list(map(get, pool)), block_hashes)  # pragma: no mutate
            return dict(zip(pool, found, strict=True))  # pragma: no mutate
        result: dict[ReplicaId, int] = {}
        for replica in replicas:
            entries = get(replica)
            result[replica] = entries.match(block_hashes) if entries is not None else 0
        return result

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
            for h in entries.blocks():
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
            keep = {r for r in found if (e := reps.get(r)) is not None and h in e}
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
            level: list[tuple[ReplicaId, LRU]] = []
            stale: list[ReplicaId] = []
            for r in at:
                entries = reps.get(r)
                if entries is None or entries.gapped or h not in entries:
                    stale.append(r)
                elif r not in found:
                    level.append((r, entries))
            for r in stale:
                at.discard(r)
            if len(found) + len(level) > limit:
                break
            for r, entries in level:
                found[r] = entries.match(block_hashes, i + 1)
        return found

    def blocks_of(self, replica: ReplicaId) -> int:
        """Entries currently held for ``replica``, in blocks."""
        entries = self._replicas.get(replica)
        return len(entries) if entries is not None else 0

    def holds(self, replica: ReplicaId, block_hash: BlockHash) -> bool:
        entries = self._replicas.get(replica)
        return entries is not None and block_hash in entries

    def __len__(self) -> int:
        """Distinct block hashes indexed (a block held by 3 replicas counts once). O(entries)."""
        if len(self._replicas) == 1:
            return self.entries
        if self._count_distinct is not None:  # pragma: no mutate
            # Compiled LRUs: their keys sorted in one array, 8 bytes each, instead of an int
            # object and a set entry per key (at 1,000 replicas, the simulator's peak memory).
            return self._count_distinct(list(self._replicas.values()))  # pragma: no mutate
        return len(set().union(*(e.blocks() for e in self._replicas.values())))

    @property
    def entries(self) -> int:
        """(replica, block) entries, i.e. the sum of every replica's LRU size."""
        return sum(len(e) for e in self._replicas.values())
