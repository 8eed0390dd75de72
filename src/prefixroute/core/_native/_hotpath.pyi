"""Types of the compiled hot path (``_hotpath.c``, ``chain.c``, ``lru.c``, ``lrus.c``,
``solve.c``); the Python references they must equal are named in ``__init__.py``."""

from collections.abc import Sequence
from typing import Any

from prefixroute.core.hashing import BlockHash

def chain_xxh3(data: bytes | memoryview, step: int, start: int, stop: int, chain: int) -> list[int]:
    """Hashes of blocks ``start..stop-1`` of ``data`` (``step`` bytes each), each xxh3_64 seeded
    with the previous block's hash, the first with ``chain``."""

def pack_u32(ids: object, /) -> bytes | None:
    """A list or tuple of ids, or a 1-d integer array, as little-endian uint32 bytes, with
    ``BlockHasher._packed``'s errors; None for any other container (Python converts it)."""

def add_observations(
    a: list[list[float]], c: list[float], windows: Sequence[Sequence[Any]], theta: Sequence[float],
    factor: float, floors: Sequence[float], /,
) -> int | None:
    """``core._solve.add_observations`` (the speed model's normal equations) to the bit; None,
    with ``a`` and ``c`` unchanged, where a ratio is not a number (the reference decides)."""

def solve_feasible(
    a: list[list[float]], c: list[float], current: Sequence[float], free: Sequence[int], /
) -> list[float]:
    """``core._solve.solve_feasible`` to the bit."""

def context_per_token(window: Sequence[Any], /) -> float:
    """``core.speed_fit._context_per_token`` to the bit."""

def match_each(lrus: Sequence[object], block_hashes: Sequence[int], /) -> list[int]:
    """``[lru.match(block_hashes) for lru in lrus]``, 0 for None, in one call (each block's int
    read once for all of them)."""

def distinct_blocks(lrus: Sequence[object], /) -> int:
    """How many distinct keys the compiled LRUs hold together (a key in three counts once)."""

class LRU:
    """One replica's block-hash LRU: the compiled twin of ``_lru.ReplicaLRU``."""

    gapped: bool  # blocks were removed individually: prefix closure not guaranteed

    def __init__(self, capacity: int | None) -> None: ...
    @property
    def capacity(self) -> int | None: ...
    @property
    def tick(self) -> int: ...
    def __len__(self) -> int: ...
    def __contains__(self, key: object) -> bool: ...
    def touch(self, block_hashes: Sequence[int], /) -> int: ...
    def discard(self, key: int, /) -> bool: ...
    def resize(self, capacity: int, /) -> int: ...
    def match(self, block_hashes: Sequence[int], known: int = 0, /) -> int: ...
    def blocks(self) -> list[BlockHash]: ...
