"""The replica KV block pool: pinning, LRU eviction of idle blocks, tail-first release."""

from __future__ import annotations

import pytest

from prefixroute.core import BlockHash
from prefixroute.sim.kv_cache import KVCache


def h(*xs: int) -> list[BlockHash]:
    return [BlockHash(x) for x in xs]


def test_take_uses_free_blocks_before_evicting() -> None:
    c = KVCache(4)
    c.take(2)
    assert c.free == 2 and c.evictions == 0
    for b in h(1, 2):
        assert c.register(b)
    c.release(h(1, 2), anonymous=0)
    assert c.available() == 4  # two free + two idle cached
    c.take(3)
    assert c.evictions == 1  # only one cached block had to go


def test_release_puts_tail_blocks_first_in_line_for_eviction() -> None:
    c = KVCache(3)
    c.take(3)
    for b in h(1, 2, 3):
        c.register(b)
    c.release(h(1, 2, 3), anonymous=0)
    c.take(1)  # evicts the tail block 3, keeps the shared prefix 1, 2
    assert c.lookup(h(1, 2, 3), 3) == 2


def test_pinned_blocks_are_never_evicted() -> None:
    c = KVCache(2)
    c.take(2)
    for b in h(1, 2):
        c.register(b)
    assert c.available() == 0
    with pytest.raises(ValueError):
        c.take(1)


def test_pin_makes_idle_blocks_busy_again() -> None:
    c = KVCache(2)
    c.take(1)
    c.register(BlockHash(7))
    c.release(h(7), anonymous=0)
    assert c.idle_among(h(7)) == 1
    c.pin(h(7))
    assert c.idle_among(h(7)) == 0
    assert c.used == 1


def test_duplicate_register_keeps_the_first_copy() -> None:
    c = KVCache(4, record_events=True)
    c.take(2)
    assert c.register(BlockHash(5))
    assert not c.register(BlockHash(5))
    assert c.stored == h(5)
