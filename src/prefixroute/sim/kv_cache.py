"""A replica's KV cache as blocks: vLLM's block pool in miniature.

``capacity`` blocks in all. A block is either *free* (never hashed, or reused), *in use* by one or
more running requests (pinned; reference-counted), or *cached and idle* (hashed, unreferenced,
in the LRU). Allocation takes free blocks first, then evicts the least recently used idle cached
blocks. A request's blocks are released tail first, so its last blocks are evicted before its
first, which keeps shared prefixes alive longest (vLLM's free-queue order).

Blocks are identified only by their hash here: we model occupancy and reuse, not tensor memory.

:class:`KVCache` is the readable reference. ``core/_native/kvcache.c`` is its compiled twin, with
the same answers (``tests/sim/test_kv_cache_native.py`` feeds both the same operations), several
times faster per block; :func:`make_kv_cache` picks it when it is built and not switched off
(``PREFIXROUTE_PURE_PYTHON=1``). A replica works a whole chain per call (:meth:`KVCache.acquire`,
:meth:`KVCache.register_chain`, :meth:`KVCache.release`), so the C loops over its blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prefixroute.core import BlockHash, CompiledKVCache


class BlockPool(Protocol):
    """What a replica asks of its KV block pool (:class:`KVCache` and its compiled twin)."""

    capacity: int  # total blocks
    free: int  # blocks holding nothing reusable
    evictions: int  # cached blocks dropped to make room, since creation
    stored: list[BlockHash]  # with record_events: new cached blocks since the last drain
    removed: list[BlockHash]  # with record_events: evicted blocks since the last drain

    @property
    def used(self) -> int: ...
    @property
    def cached_blocks(self) -> int: ...
    def lookup(self, hashes: Sequence[BlockHash], limit: int, /) -> int: ...
    def idle_among(self, hashes: Sequence[BlockHash], /) -> int: ...
    def available(self) -> int: ...
    def pin(self, hashes: Sequence[BlockHash], /) -> None: ...
    def take(self, n: int, /) -> None: ...
    def register(self, h: BlockHash, /) -> bool: ...
    def register_chain(
        self, hashes: Sequence[BlockHash], start: int, stop: int, /
    ) -> list[int]: ...
    def reset(self) -> bool: ...
    def release(self, cached: Sequence[BlockHash], anonymous: int, /) -> None: ...
    def acquire(self, hashes: Sequence[BlockHash], limit: int, blocks: int, /) -> int: ...


def make_kv_cache(capacity: int, record_events: bool = False, compiled: bool = True) -> BlockPool:
    """A pool of ``capacity`` blocks: the compiled one when wanted and built, else the
    reference (same answers)."""
    native = CompiledKVCache
    if compiled and native is not None:
        return native(capacity, record_events)  # type: ignore[return-value]  # int hashes
    return KVCache(capacity, record_events=record_events)


@dataclass(slots=True)
class KVCache:
    capacity: int  # total blocks
    free: int = -1  # blocks holding nothing reusable
    evictions: int = 0  # cached blocks dropped to make room, since creation
    _refs: dict[BlockHash, int] = field(default_factory=dict)  # cached hash -> running users
    _idle: OrderedDict[BlockHash, None] = field(default_factory=OrderedDict)  # LRU, oldest first
    record_events: bool = False  # keep stored/removed lists for engine-style KV events
    stored: list[BlockHash] = field(default_factory=list)  # new cached blocks since last drain
    removed: list[BlockHash] = field(default_factory=list)  # evicted blocks since last drain

    def __post_init__(self) -> None:
        if self.free < 0:
            self.free = self.capacity

    @property
    def used(self) -> int:
        """Blocks not available without eviction (pinned by a running request)."""
        return self.capacity - self.free - len(self._idle)

    @property
    def cached_blocks(self) -> int:
        return len(self._refs)

    def lookup(self, hashes: Sequence[BlockHash], limit: int) -> int:
        """How many leading blocks of ``hashes`` (at most ``limit``) are cached."""
        refs = self._refs
        n = 0
        for h in hashes[:limit]:
            if h not in refs:
                break
            n += 1
        return n

    def idle_among(self, hashes: Sequence[BlockHash]) -> int:
        """How many of these cached blocks are idle (pinning them shrinks the evictable pool)."""
        refs = self._refs
        return sum(1 for h in hashes if refs[h] == 0)

    def available(self) -> int:
        """Blocks an allocation could get: free plus evictable."""
        return self.free + len(self._idle)

    def acquire(self, hashes: Sequence[BlockHash], limit: int, blocks: int) -> int:
        """Admit a request that needs ``blocks`` blocks in all: pin the leading cached blocks of
        ``hashes`` (at most ``limit``) and take the rest for new content. Returns the hit in
        blocks, or -1, changing nothing, when they do not fit yet."""
        hit = self.lookup(hashes, limit)
        hits = hashes[:hit]
        # Pinning the hit blocks removes them from the evictable pool, so count them out.
        if blocks - hit > self.available() - self.idle_among(hits):
            return -1
        self.pin(hits)
        self.take(blocks - hit)
        return hit

    def pin(self, hashes: Sequence[BlockHash]) -> None:
        """A request starts using these cached blocks (a hit)."""
        for h in hashes:
            n = self._refs[h]
            if n == 0:
                del self._idle[h]
            self._refs[h] = n + 1

    def take(self, n: int) -> None:
        """Take ``n`` blocks for new content, evicting idle cached blocks if needed."""
        if n > self.available():
            raise ValueError(f"need {n} blocks, {self.available()} available")
        from_free = min(n, self.free)
        self.free -= from_free
        for _ in range(n - from_free):
            h, _ = self._idle.popitem(last=False)
            del self._refs[h]
            if self.record_events:
                self.removed.append(h)
            self.evictions += 1

    def register(self, h: BlockHash) -> bool:
        """A block the request computed now holds ``h`` (pinned by it). False if a copy is already
        cached: the caller's block then stays an anonymous duplicate, freed on release."""
        if h in self._refs:
            return False
        self._refs[h] = 1
        if self.record_events:
            self.stored.append(h)
        return True

    def register_chain(self, hashes: Sequence[BlockHash], start: int, stop: int) -> list[int]:
        """:meth:`register` each of ``hashes[start:stop]`` in order; returns the indices (in
        ``hashes``) of those already cached, which stay anonymous duplicates."""
        refs = self._refs
        stored = self.stored if self.record_events else None
        duplicates = []
        for i in range(start, stop):
            h = hashes[i]
            if h in refs:
                duplicates.append(i)
                continue
            refs[h] = 1
            if stored is not None:
                stored.append(h)
        return duplicates

    def reset(self) -> bool:
        """Drop every cached block, as vLLM's ``reset_prefix_cache``; False (nothing done) while
        any block is in use. Drops are not recorded as removals: the caller reports a reset."""
        if self.used:
            return False
        self.free = self.capacity
        self._refs.clear()
        self._idle.clear()
        self.stored, self.removed = [], []
        return True

    def release(self, cached: Sequence[BlockHash], anonymous: int) -> None:
        """A request ends: unpin its cached blocks (tail first into the LRU) and free the rest."""
        self.free += anonymous
        refs, idle = self._refs, self._idle
        for h in reversed(cached):
            n = refs[h] - 1
            refs[h] = n
            if n == 0:
                idle[h] = None
