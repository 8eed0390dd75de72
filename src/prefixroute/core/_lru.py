"""One replica's LRU of block hashes, for the prefix index (:mod:`prefixroute.core.index`).

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

The compiled twin of :class:`ReplicaLRU` (``LRU``, ``_native/lru.c`` and ``table.h``) keeps
the same stamps and queue in C: an open-addressing table with the 64-bit keys inline, so a touch
is one probe instead of a dict entry plus an int object, and the probes of a chain are
prefetched. At 8k tokens and a 1M-block index that makes the insert of a routing decision
several times faster. :class:`ReplicaLRU` stays the readable reference: the tests feed both the
same operations and compare every answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterable, Sequence
from itertools import repeat
from typing import Protocol

from prefixroute.core import _native
from prefixroute.core.hashing import BlockHash

COMPACT_FACTOR = 4  # compact a replica's queue when it holds this many times its live entries
COMPACT_MIN = 4096  # ... and at least this many entries, entries


class LRU(Protocol):
    """What the index asks of one replica's entries (both implementations give it)."""

    gapped: bool  # blocks were removed individually, or a chain did not start at the root

    @property
    def capacity(self) -> int | None: ...
    @property
    def tick(self) -> int: ...  # chains inserted so far (the next insert's tick)
    def __len__(self) -> int: ...
    def __contains__(self, block_hash: object) -> bool: ...
    def blocks(self) -> Iterable[BlockHash]: ...
    def touch(self, block_hashes: Sequence[BlockHash], /) -> int: ...
    def discard(self, block_hash: BlockHash, /) -> bool: ...
    def resize(self, capacity: int, /) -> int: ...
    def match(self, block_hashes: Sequence[BlockHash], known: int = 0, /) -> int: ...


def lru_factory(compiled: bool) -> Callable[[int | None], LRU]:
    """Makes one replica's LRU from its capacity in blocks (None: unbounded): the compiled one
    when wanted and built, else the reference (same answers)."""
    native = _native.LRU
    return native if compiled and native is not None else ReplicaLRU


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


class ReplicaLRU:
    """One replica's LRU of block hashes: ``stamps`` and ``queue`` (module docstring).

    The reference implementation: the compiled ``LRU`` (``_native/lru.c``) gives the same
    answer to every call, and the index uses that one when it is built.
    """

    __slots__ = ("capacity", "stamps", "queue", "queued", "cursor", "tick", "gapped")

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity  # blocks; None = unbounded
        self.stamps: dict[BlockHash, int] = {}  # hash -> tick of last touch
        self.queue: deque[tuple[Sequence[BlockHash], int]] = deque()
        self.queued = 0  # hashes referenced by ``queue`` (live or stale)
        self.cursor = 0  # position reached in ``queue[0]`` by eviction
        self.tick = 0  # next tick to hand out
        self.gapped = False  # blocks were removed individually: prefix closure not guaranteed

    def __len__(self) -> int:
        return len(self.stamps)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.stamps

    def blocks(self) -> Iterable[BlockHash]:
        """The held block hashes, in no particular order."""
        return self.stamps.keys()

    def touch(self, block_hashes: Sequence[BlockHash]) -> int:
        """Stamp the chain with a new tick, tail first; returns how many entries were evicted."""
        n = len(block_hashes)
        if not n:
            return 0
        tail_first = block_hashes[::-1]
        tick = self.tick
        self.tick += 1
        self.stamps.update(zip(tail_first, repeat(tick)))
        if self.capacity is None:
            return 0  # nothing will ever be evicted: no need to remember the order
        self.queue.append((tail_first, tick))
        self.queued += n
        evicted = self._evict(self.capacity)
        if self.queued > COMPACT_FACTOR * len(self.stamps) + COMPACT_MIN:
            self._compact()
        return evicted

    def resize(self, capacity: int) -> int:
        """Set a bounded LRU's capacity (blocks, at least 1); returns the entries evicted to fit
        it, least recently touched first. An unbounded LRU keeps no order, so it cannot."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1 block")
        if self.capacity is None:
            raise ValueError("an unbounded LRU keeps no order to resize by")
        self.capacity = capacity
        return self._evict(capacity)

    def _evict(self, cap: int) -> int:
        """Drop least recently touched entries until the replica is within capacity."""
        stamps, queue = self.stamps, self.queue
        evicted = 0
        while len(stamps) > cap:
            hashes, tick = queue[0]
            i, end = self.cursor, len(hashes)
            while i < end and len(stamps) > cap:
                h = hashes[i]
                if stamps.get(h) == tick:
                    del stamps[h]
                    evicted += 1
                i += 1
            if i == end:
                queue.popleft()
                self.queued -= end
                self.cursor = 0
            else:
                self.cursor = i
        return evicted

    def _compact(self) -> None:
        """Drop the stale hashes from the queue, keeping its order (leaves first within a tick)."""
        stamps, old = self.stamps, self.queue
        queue: deque[tuple[Sequence[BlockHash], int]] = deque()
        queued = 0
        for k, (hashes, tick) in enumerate(old):
            live = [h for h in (hashes[self.cursor :] if k == 0 else hashes)
                    if stamps.get(h) == tick]  # fmt: skip
            if live:
                queue.append((live, tick))
                queued += len(live)
        self.queue = queue
        self.queued = queued
        self.cursor = 0

    def discard(self, block_hash: BlockHash) -> bool:
        """Drop one entry; whether it was held."""
        return self.stamps.pop(block_hash, None) is not None

    def match(self, block_hashes: Sequence[BlockHash], known: int = 0) -> int:
        """Blocks of the chain held, counted from the first, given that its first ``known`` are
        held (0: nothing known, the first is checked)."""
        n = len(block_hashes)
        stamps = self.stamps
        if not n or (known < 1 and block_hashes[0] not in stamps):
            return 0
        m = max(1, min(known, n))
        if self.gapped:
            while m < n and block_hashes[m] in stamps:
                m += 1
            return m
        return held_prefix(block_hashes, stamps, m)
