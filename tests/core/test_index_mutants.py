"""The prefix index's documented rules that mutation testing found unpinned (issue 16,
docs/mutation.md): ``deepest_holders``' stopping rules as its docstring states them (whole
positions only, never past ``limit``, no pass over a position with more than ``2 * limit``
holders beyond those found, stale holders dropped by a lookup), the positions the holder map
records (every ``holder_stride``-th block and the last one), a sweep keeping live holders, and
the configuration errors' messages."""

from __future__ import annotations

import pytest

from prefixroute.core import BlockHash, BlockHasher, ConfigError, PrefixIndex, ReplicaId
from prefixroute.core._lru import ReplicaLRU

HASHER = BlockHasher(block_size=1)
X, Y, Z, W, V = (ReplicaId(n) for n in ("x", "y", "z", "w", "v"))


def chain(n: int, first: int = 1) -> list[BlockHash]:
    return HASHER.hash_tokens(list(range(first, first + n)))


def ints(n: int, first: int) -> list[BlockHash]:
    """``n`` distinct block hashes, cheap to make: the index never reads a hash's value."""
    return [BlockHash(k) for k in range(first, first + n)]


def holder_index(stride: int = 4) -> PrefixIndex:
    return PrefixIndex(holder_map=True, holder_stride=stride)


def stale_beside_live() -> tuple[PrefixIndex, list[BlockHash]]:
    """A one-block chain held by X (live) and Z and W (removed since: stale holders), so three
    holders stand at its one position."""
    index = holder_index()
    c = chain(1)
    for r in (X, Z, W):
        index.insert(r, c)
    index.remove_replica(Z)
    index.remove_replica(W)
    return index, c


# --- stopping rules ---------------------------------------------------------------------------


def test_a_limit_of_one_returns_the_one_deepest_holder() -> None:
    index = holder_index()
    c = chain(3)
    index.insert(X, c)
    assert index.deepest_holders(c, 1) == {X: 3}


def test_a_position_with_exactly_limit_holders_is_taken_whole() -> None:
    index = holder_index()
    c = chain(3)
    index.insert(X, c)
    index.insert(Y, c)
    assert index.deepest_holders(c, 2) == {X: 3, Y: 3}


def test_a_position_with_2_limit_holders_is_read_and_its_stale_ones_skipped() -> None:
    index = holder_index()
    c = chain(1)
    index.insert(X, c)
    index.insert(Z, c)
    index.remove_replica(Z)  # Z is a stale holder now
    # 2 holders at the position, not more than 2 * limit: read, and the live one taken.
    assert index.deepest_holders(c, 1) == {X: 1}


def test_a_position_with_more_than_2_limit_holders_is_not_read() -> None:
    index, c = stale_beside_live()
    assert index.deepest_holders(c, 1) == {}  # 3 > 2: not read, though only X is live


def test_the_2_limit_allowance_is_beyond_the_holders_already_found() -> None:
    index = holder_index()
    long, short = chain(8), chain(4)  # short is long's prefix
    index.insert(X, long)  # found first, at long's last block
    for r in (Y, Z, W):
        index.insert(r, short)
    index.remove_replica(Z)
    index.remove_replica(W)
    # At position 0: X, Y and two stale holders, 4 <= 2 * 2 + 1 found: read; Y is taken.
    assert index.deepest_holders(long, 2) == {X: 8, Y: 4}


def test_a_lookup_drops_the_stale_holders_it_reads() -> None:
    index, c = stale_beside_live()
    assert index.deepest_holders(c, 2) == {X: 1}  # 3 <= 4: read; Z and W dropped
    assert index.deepest_holders(c, 1) == {X: 1}  # only X is left at the position


# --- recorded positions -----------------------------------------------------------------------


def test_only_every_stride_th_block_and_the_last_are_recorded() -> None:
    index = holder_index(stride=4)
    index.insert(X, chain(3))  # recorded at positions 0 and 2
    index.insert(Y, chain(1))  # recorded at position 0
    request = [*chain(3), *chain(1, first=100)]  # positions 0 and 3 recorded for a lookup
    # Position 3: nobody. Position 0: X and Y, two for a limit of 1: the walk stops there,
    # though X holds block 2 (not a recorded position).
    assert index.deepest_holders(request, 1) == {}


@pytest.mark.parametrize("n", [2, 4, 6])
def test_the_last_block_of_a_chain_is_recorded(n: int) -> None:
    index = holder_index(stride=4)
    c = chain(n)
    index.insert(X, c)
    index.insert(Y, c[:1])
    # X is found at the chain's last block before position 0 (X and Y) stops the walk.
    assert index.deepest_holders(c, 1) == {X: n}


def test_a_sweep_keeps_the_holders_that_still_hold_their_blocks() -> None:
    # A sweep runs once the map grew by HOLDER_SWEEP_MIN (65,536) entries: a chain of 70,000
    # blocks recorded at every position triggers one.
    index = holder_index(stride=1)
    c = chain(3)
    index.insert(X, c)
    index.insert(V, ints(70_000, first=1000))
    assert index.deepest_holders(c, 1) == {X: 3}


def test_a_cleared_replica_is_no_longer_gapped() -> None:
    # A replica is matched by a linear walk "until it is cleared" (the module docstring).
    index = holder_index()
    index.insert(X, chain(2), from_root=False)
    assert index.gapped_replicas == {X}
    index.clear_replica(X)
    assert index.gapped_replicas == frozenset()


def test_a_removed_replica_is_no_longer_gapped() -> None:
    # "Replicas the holder map cannot see": a replica gone is not one of them.
    index = holder_index()
    index.insert(X, chain(2), from_root=False)
    index.insert(Y, chain(2), from_root=False)
    index.remove_replica(X)
    assert index.gapped_replicas == {Y}


# --- configuration errors ---------------------------------------------------------------------


def test_a_capacity_under_one_block_is_refused_with_its_value() -> None:
    with pytest.raises(ConfigError) as default:
        PrefixIndex(0)
    assert str(default.value) == "index capacity must be at least 1 block, got 0"
    with pytest.raises(ConfigError) as per_replica:
        PrefixIndex().add_replica(X, capacity_blocks=-1)
    assert str(per_replica.value) == "index capacity must be at least 1 block, got -1"


def test_resizing_a_replica_lru_says_what_is_wrong() -> None:
    # The Python LRU's own refusals (the index checks capacities before it asks).
    lru = ReplicaLRU(4)
    with pytest.raises(ValueError, match="^capacity must be at least 1 block$"):
        lru.resize(0)
    with pytest.raises(ValueError, match="^an unbounded LRU keeps no order to resize by$"):
        ReplicaLRU(None).resize(3)


def test_deepest_holders_without_the_map_says_how_to_switch_it_on() -> None:
    with pytest.raises(ConfigError) as no_map:
        PrefixIndex(holder_map=False).deepest_holders(chain(2), 1)
    assert str(no_map.value) == "deepest_holders needs the holder map (holder_map=True)"


# --- the holder map's upkeep ------------------------------------------------------------------


def test_switching_the_map_on_records_every_replica_after_a_gapped_one() -> None:
    # Past HOLDER_MAP_REPLICAS (64) the map is built from every held block; gapped replicas
    # (chains not from the root) are left out, and the others after them are not.
    index = PrefixIndex()
    c = chain(3)
    index.insert(ReplicaId("gapped"), chain(2, first=500), from_root=False)
    index.insert(X, c)
    for i in range(64):
        index.add_replica(ReplicaId(f"r{i}"))
    assert index.has_holder_map
    assert index.deepest_holders(c, 1) == {X: 3}


def stale_pair(index: PrefixIndex, c: list[BlockHash]) -> None:
    """Z and W become stale holders of ``c``: with X live, 3 > 2 * 1, so a lookup with a limit
    of 1 does not read the position (and drops nobody) until a sweep does."""
    for r in (Z, W):
        index.insert(r, c)
        index.remove_replica(r)


def test_a_sweep_runs_once_the_map_doubled_since_the_last_one() -> None:
    # HOLDER_SWEEP_MIN = 65,536: a sweep runs once the map grew by that much more than the
    # entries the last sweep left. The margins below are thousands of entries wide.
    index = holder_index(stride=1)
    c = chain(1)
    index.insert(X, c)
    stale_pair(index, c)
    index.insert(V, ints(60_000, first=1000))  # 60,003 added: no sweep yet
    assert index.deepest_holders(c, 1) == {}
    index.insert(V, ints(10_000, first=100_000))  # over 65,536 added: a sweep
    assert index.deepest_holders(c, 1) == {X: 1}  # Z and W dropped
    stale_pair(index, c)  # at least 60,001 entries were live after that sweep
    index.insert(Y, ints(100_000, first=200_000))  # under 60,001 + 65,536 added: none
    assert index.deepest_holders(c, 1) == {}
    index.insert(Y, ints(40_000, first=400_000))  # over 70,001 + 65,536: a sweep
    assert index.deepest_holders(c, 1) == {X: 1}


def test_the_map_grows_by_one_entry_per_recorded_block() -> None:
    # 40,000 one-block chains add 40,000 entries, under 65,536: no sweep, the stale stay.
    index = holder_index(stride=1)
    c = chain(1)
    index.insert(X, c)
    stale_pair(index, c)
    for k in range(40_000):
        index.insert(V, [BlockHash(k)])
    assert index.deepest_holders(c, 1) == {}


# --- LRU eviction across a compaction of its queue --------------------------------------------


def held(index: PrefixIndex, replica: ReplicaId, blocks: dict[str, BlockHash]) -> set[str]:
    return {name for name, h in blocks.items() if index.holds(replica, h)}


def test_eviction_stays_least_recently_used_first_after_the_queue_is_compacted() -> None:
    # _lru's docstring: eviction takes the least recently touched blocks, a chain's leaves first;
    # compacting the queue (once it holds 4x the live entries, here after thousands of touches
    # of one block) drops only stale entries and keeps that order.
    index = PrefixIndex(4, compiled=False)
    p = chain(3, first=1)  # p0 <- p1 <- p2
    q, x = chain(1, first=10), chain(1, first=20)
    ys = [chain(1, first=30 + i) for i in range(3)]
    blocks = {"p0": p[0], "p1": p[1], "p2": p[2], "q": q[0], "x": x[0]}
    blocks |= {f"y{i}": y[0] for i, y in enumerate(ys)}
    index.insert(X, p)
    index.insert(X, q)
    index.insert(X, x)  # 5 blocks: p's leaf p2 goes
    assert held(index, X, blocks) == {"p0", "p1", "q", "x"}
    for _ in range(5000):
        index.insert(X, x)  # x stays the most recent; its older entries go stale
    for y in ys:
        index.insert(X, y)  # p1, then p0, then q
    assert held(index, X, blocks) == {"x", "y0", "y1", "y2"}
    assert index.evictions == 4


def test_eviction_after_a_compaction_with_nothing_half_consumed() -> None:
    index = PrefixIndex(3, compiled=False)
    a, b, c, d, e = (chain(1, first=k) for k in (1, 2, 3, 4, 5))
    blocks = {"a": a[0], "b": b[0], "c": c[0], "d": d[0], "e": e[0]}
    for h in (a, b):
        index.insert(X, h)
    for _ in range(5000):
        index.insert(X, c)
    index.insert(X, d)  # a is the least recently used
    assert held(index, X, blocks) == {"b", "c", "d"}
    index.insert(X, e)
    assert held(index, X, blocks) == {"c", "d", "e"}


def test_the_insert_that_triggers_a_sweep_keeps_its_own_holders() -> None:
    # "The holder map records every held chain" (deepest_holders): the chain whose insert makes
    # the map sweep is held by then, so the sweep must not drop it.
    index = holder_index(stride=1)
    long_chain = ints(70_000, first=1000)  # over HOLDER_SWEEP_MIN entries: this insert sweeps
    index.insert(V, long_chain)
    assert index.deepest_holders(long_chain, 1) == {V: 70_000}
