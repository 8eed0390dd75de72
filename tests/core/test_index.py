"""Tests for prefixroute.core.index: PrefixIndex against a brute-force per-replica LRU model."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from prefixroute.core import BlockHash, BlockHasher, ConfigError, PrefixIndex, ReplicaId
from prefixroute.core._lru import COMPACT_FACTOR, COMPACT_MIN, ReplicaLRU, lru_factory

HASHER = BlockHasher(block_size=1)
NAMES = [ReplicaId(f"r{i}") for i in range(5)]
MACHINE_NAMES = NAMES[:3]  # few replicas, so rules often meet on the same one
HOLDER_STRIDE = 2  # small, so chains of a few blocks have several recorded positions


def chain(*tokens: int) -> list[BlockHash]:
    return HASHER.hash_tokens(list(tokens))


class ModelIndex:
    """The brute-force model: per replica, a list of hashes from least to most recently touched."""

    def __init__(self, default_capacity: int | None) -> None:
        self.default_capacity = default_capacity
        self.lru: dict[ReplicaId, list[BlockHash]] = {}
        self.capacity: dict[ReplicaId, int | None] = {}
        self.evictions = 0

    def add_replica(self, r: ReplicaId, capacity: int | None) -> None:
        if r not in self.lru:
            self.lru[r] = []
            self.capacity[r] = capacity if capacity is not None else self.default_capacity

    def insert(self, r: ReplicaId, hashes: list[BlockHash]) -> int:
        self.add_replica(r, None)
        lru = self.lru[r]
        # Touch from the last block to the first, so the first block ends up the most recent.
        for h in reversed(hashes):
            if h in lru:
                lru.remove(h)
            lru.append(h)
        cap = self.capacity[r]
        evicted = 0
        while cap is not None and len(lru) > cap:
            lru.pop(0)
            evicted += 1
        self.evictions += evicted
        return evicted

    def match(self, hashes: list[BlockHash]) -> dict[ReplicaId, int]:
        out = {}
        for r, lru in self.lru.items():
            held = set(lru)
            k = 0
            while k < len(hashes) and hashes[k] in held:
                k += 1
            if k:
                out[r] = k
        return out


tokens_strategy = st.lists(st.integers(min_value=0, max_value=2), max_size=8)
capacities = st.none() | st.integers(min_value=1, max_value=10)


class IndexMachine(RuleBasedStateMachine):
    """Random add/insert/remove/clear sequences; after every step the index equals the model."""

    COMPILED = True  # the compiled LRU when it is built; PythonIndexMachine runs the reference
    chains = Bundle("chains")

    def __init__(self) -> None:
        super().__init__()
        self.index: PrefixIndex
        self.model: ModelIndex
        self.seen: set[BlockHash] = set()
        self.queries: list[list[BlockHash]] = []  # every chain made so far
        self.parent: dict[BlockHash, BlockHash | None] = {}
        self.ever: dict[ReplicaId, set[BlockHash]] = {}  # inserted since (re)registration

    @initialize(default=capacities, holder_map=st.booleans())
    def setup(self, default: int | None, holder_map: bool) -> None:
        # The holder map (large clusters) must never change what the index holds or matches.
        self.index = PrefixIndex(
            default, holder_map=holder_map, holder_stride=HOLDER_STRIDE, compiled=self.COMPILED
        )
        self.model = ModelIndex(default)

    def _remember(self, hashes: list[BlockHash]) -> None:
        for i, h in enumerate(hashes):
            self.seen.add(h)
            self.parent[h] = hashes[i - 1] if i else None

    def _held(self, r: ReplicaId) -> set[BlockHash]:
        return {h for h in self.seen if self.index.holds(r, h)}

    @rule(target=chains, tokens=tokens_strategy)
    def make_chain(self, tokens: list[int]) -> list[BlockHash]:
        hashes = HASHER.hash_tokens(tokens)
        self._remember(hashes)
        self.queries.append(hashes)
        return hashes

    @rule(r=st.sampled_from(MACHINE_NAMES), capacity=capacities)
    def add_replica(self, r: ReplicaId, capacity: int | None) -> None:
        if r not in self.model.lru:
            self.ever[r] = set()
        self.index.add_replica(r, capacity)
        self.model.add_replica(r, capacity)

    @rule(r=st.sampled_from(MACHINE_NAMES), hashes=chains)
    def insert(self, r: ReplicaId, hashes: list[BlockHash]) -> None:
        if r not in self.model.lru:
            self.ever[r] = set()
        before = self._held(r) if r in self.model.lru else set()
        evicted = self.index.insert(r, hashes)
        assert evicted == self.model.insert(r, hashes)
        self.ever[r].update(hashes)
        after = self._held(r)
        # Leaves go before parents: no block survives an insert whose held parent was evicted.
        for h in after:
            p = self.parent[h]
            if p is not None and (p in before or p in hashes):
                assert p in after, "a parent was evicted while its child stayed"

    @rule(r=st.sampled_from(MACHINE_NAMES))
    def remove_replica(self, r: ReplicaId) -> None:
        self.index.remove_replica(r)
        self.model.lru.pop(r, None)
        self.model.capacity.pop(r, None)
        self.ever.pop(r, None)

    @precondition(lambda self: bool(self.model.lru))
    @rule(data=st.data())
    def clear_replica(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(sorted(self.model.lru)), label="replica")
        self.index.clear_replica(r)
        self.model.lru[r].clear()

    @rule(r=st.sampled_from(MACHINE_NAMES), hashes=chains, data=st.data())
    def remove_blocks(self, r: ReplicaId, hashes: list[BlockHash], data: st.DataObject) -> None:
        # Any subset, including middle blocks of a chain (engines evict whatever they like).
        doomed = data.draw(st.lists(st.sampled_from(hashes)) if hashes else st.just([]))
        self.index.remove_blocks(r, iter(doomed))
        if r in self.model.lru:
            self.model.lru[r] = [h for h in self.model.lru[r] if h not in doomed]

    @precondition(lambda self: any(self.model.lru.values()))
    @rule(data=st.data())
    def remove_held_blocks(self, data: st.DataObject) -> None:
        # An engine reports evicting blocks the index holds, often from the middle of a chain.
        r = data.draw(st.sampled_from(sorted(r for r, lru in self.model.lru.items() if lru)))
        doomed = data.draw(st.lists(st.sampled_from(self.model.lru[r]), min_size=1, max_size=3))
        self.index.remove_blocks(r, doomed)
        self.model.lru[r] = [h for h in self.model.lru[r] if h not in doomed]

    @invariant()
    def match_is_longest_contiguous_prefix(self) -> None:
        for hashes in self.queries:
            got = self.index.match(hashes)
            assert got == self.model.match(hashes), hashes
            for r, k in got.items():
                assert 0 < k <= len(hashes)
                assert set(hashes[:k]) <= self.ever[r], "matched blocks that were never inserted"
            some = MACHINE_NAMES[::2]  # the optional replica filter
            assert self.index.match(hashes, some) == {r: k for r, k in got.items() if r in some}
            # match_each: the same matches, every replica asked for present (0: none), in order
            each = self.index.match_each(hashes, some)
            assert list(each.items()) == [(r, got.get(r, 0)) for r in some]

    @invariant()
    def deepest_holders_are_the_longest_matches(self) -> None:
        if not self.index.has_holder_map:
            return
        gapped = self.index.gapped_replicas
        for hashes in self.queries:
            model = {r: k for r, k in self.model.match(hashes).items() if r not in gapped}
            # With room for everybody, it finds every replica the holder map can see.
            assert self.index.deepest_holders(hashes, 2 * len(NAMES)) == model
            for limit in (0, 1, 2):
                got = self.index.deepest_holders(hashes, limit)
                assert len(got) <= limit
                assert all(model.get(r) == k for r, k in got.items()), (got, model)
                # Whole levels, deepest first: anyone left out matches no deeper recorded
                # position (a multiple of the stride) than everyone taken matches.
                for left_out, k in model.items():
                    if left_out in got:
                        continue
                    floor = (k - 1) // HOLDER_STRIDE * HOLDER_STRIDE
                    assert all(m > floor for m in got.values()), (left_out, k, got)

    @invariant()
    def same_entries_as_model(self) -> None:
        index, model = self.index, self.model
        assert sorted(index.replicas) == sorted(model.lru)
        for r in MACHINE_NAMES:
            if r in model.lru:
                assert self._held(r) == set(model.lru[r])
                assert index.blocks_of(r) == len(model.lru[r])
                cap = model.capacity[r]
                assert cap is None or index.blocks_of(r) <= cap
            else:
                assert index.blocks_of(r) == 0
                assert not self._held(r), "an unregistered replica still holds entries"
        union = set().union(*model.lru.values()) if model.lru else set()
        assert len(index) == len(union)
        assert index.entries == sum(len(lru) for lru in model.lru.values())
        assert index.evictions == model.evictions


class PythonIndexMachine(IndexMachine):
    """The same rules against the pure-Python LRU, the reference of the compiled one."""

    COMPILED = False


for _machine in (IndexMachine, PythonIndexMachine):
    _machine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
TestIndexMachine = IndexMachine.TestCase
TestPythonIndexMachine = PythonIndexMachine.TestCase


# --- example-based tests --------------------------------------------------------------------
R0, R1, R2 = NAMES[:3]


def test_long_run_with_many_retouches_matches_the_model() -> None:
    # Thousands of touches of the same few blocks, then pressure from new ones: long enough for
    # the index to compact its bookkeeping of old touches, which a short hypothesis run never is.
    rng = random.Random(1)
    index, model = PrefixIndex(default_capacity_blocks=50), ModelIndex(50)
    hot = [chain(*[i] * n) for i in range(5) for n in (3, 8)]  # 40 distinct blocks
    cold = [chain(100 + i, *range(rng.randrange(1, 12))) for i in range(300)]
    schedule = [rng.choice(hot) for _ in range(1500)] + [
        rng.choice(hot + cold) for _ in range(1500)
    ]
    for step, hashes in enumerate(schedule):
        assert index.insert(R0, hashes) == model.insert(R0, hashes)
        if step % 50 == 0 or step > 1490:
            for probe in hot + cold[:20]:
                assert index.match(probe) == model.match(probe)
            assert index.blocks_of(R0) == len(model.lru[R0]) <= 50
    assert index.evictions == model.evictions > 0


def test_match_is_longest_contiguous_prefix_per_replica() -> None:
    index = PrefixIndex()
    full = chain(1, 2, 3, 4)
    index.insert(R0, full)
    index.insert(R1, full[:2])
    index.insert(R2, chain(9, 9))
    assert index.match(full) == {R0: 4, R1: 2}
    assert index.match(chain(1, 2, 7)) == {R0: 2, R1: 2}
    assert index.match(chain(5)) == {}
    assert index.match([]) == {}


def test_match_stops_at_a_hole() -> None:
    index = PrefixIndex()
    full = chain(1, 2, 3, 4)
    index.insert(R0, full)
    index.remove_blocks(R0, [full[1]])
    assert index.match(full) == {R0: 1}
    assert index.holds(R0, full[3])


def test_capacity_evicts_least_recently_touched_first() -> None:
    index = PrefixIndex(default_capacity_blocks=4)
    a, b, c = chain(1, 1), chain(2, 2), chain(3, 3)
    index.insert(R0, a)
    index.insert(R0, b)
    index.insert(R0, a)  # touch a: b is now the oldest chain
    assert index.insert(R0, c) == 2
    assert index.match(a) == {R0: 2}
    assert index.match(b) == {}
    assert index.match(c) == {R0: 2}
    assert index.evictions == 2


def test_eviction_takes_leaves_before_parents() -> None:
    index = PrefixIndex(default_capacity_blocks=3)
    long = chain(1, 2, 3)
    index.insert(R0, long)
    index.insert(R0, chain(7))  # one block over capacity: the leaf of the older chain goes
    assert index.match(long) == {R0: 2}
    assert not index.holds(R0, long[2])


def test_chain_longer_than_capacity_keeps_its_prefix() -> None:
    index = PrefixIndex()
    index.add_replica(R0, capacity_blocks=3)
    full = chain(*range(10))
    assert index.insert(R0, full) == 7
    assert index.match(full) == {R0: 3}
    assert index.blocks_of(R0) == 3
    assert index.evictions == 7


def test_capacity_is_per_replica() -> None:
    index = PrefixIndex(default_capacity_blocks=2)
    index.add_replica(R1, capacity_blocks=5)
    full = chain(*range(6))
    index.insert(R0, full)  # auto-registered with the default capacity
    index.insert(R1, full)
    assert index.blocks_of(R0) == 2
    assert index.blocks_of(R1) == 5
    assert index.evictions == 4 + 1


@pytest.mark.parametrize("capacity", [0, -3])
def test_capacity_below_one_block_raises(capacity: int) -> None:
    with pytest.raises(ConfigError):
        PrefixIndex().add_replica(R0, capacity_blocks=capacity)
    with pytest.raises(ConfigError):
        PrefixIndex(default_capacity_blocks=capacity).add_replica(R0)


def test_add_replica_is_idempotent_and_keeps_entries() -> None:
    index = PrefixIndex()
    index.add_replica(R0)
    index.insert(R0, chain(1, 2))
    index.add_replica(R0)
    assert index.replicas == [R0]
    assert index.blocks_of(R0) == 2


def test_remove_replica_removes_all_its_entries() -> None:
    index = PrefixIndex()
    shared, own = chain(1, 2), chain(3, 4)
    index.insert(R0, shared)
    index.insert(R0, own)
    index.insert(R1, shared)
    index.remove_replica(R0)
    assert index.replicas == [R1]
    assert index.match(own) == {}
    assert index.match(shared) == {R1: 2}
    assert len(index) == 2  # only R1's hashes remain
    assert index.entries == 2
    assert not any(index.holds(R0, h) for h in shared + own)
    index.remove_replica(R0)  # unknown replica: no-op
    index.remove_replica(R1)
    assert len(index) == 0
    assert index.entries == 0


def test_removed_slot_is_reused_without_old_entries() -> None:
    index = PrefixIndex()
    old = chain(1, 2, 3)
    index.insert(R0, old)
    index.insert(R1, chain(5))
    index.remove_replica(R0)
    index.add_replica(R2)  # takes R0's freed slot
    assert index.match(old) == {}
    assert not any(index.holds(R2, h) for h in old)
    assert index.blocks_of(R2) == 0
    index.insert(R2, chain(1))
    assert index.match(old) == {R2: 1}
    assert index.match(chain(5)) == {R1: 1}


def test_many_replicas_beyond_one_machine_word() -> None:
    # Bitmasks are Python ints: replica slots past 64 must work like the first ones.
    index = PrefixIndex()
    names = [ReplicaId(f"x{i}") for i in range(130)]
    full = chain(1, 2, 3)
    for i, r in enumerate(names):
        index.insert(r, full[: i % 4])
    got = index.match(full)
    assert got == {r: i % 4 for i, r in enumerate(names) if i % 4}


def test_clear_replica_keeps_it_registered() -> None:
    index = PrefixIndex(default_capacity_blocks=4)
    shared = chain(1, 2)
    index.insert(R0, shared)
    index.insert(R1, shared)
    index.clear_replica(R0)
    assert index.replicas == [R0, R1]
    assert index.blocks_of(R0) == 0
    assert index.match(shared) == {R1: 2}
    assert len(index) == 2
    index.insert(R0, chain(3, 4, 5, 6, 7))  # capacity still applies after clearing
    assert index.blocks_of(R0) == 4


def test_remove_blocks_drops_only_named_entries_of_that_replica() -> None:
    index = PrefixIndex()
    full = chain(1, 2, 3)
    index.insert(R0, full)
    index.insert(R1, full)
    index.remove_blocks(R0, [full[2], full[2], chain(9)[0]])  # duplicates and strangers are fine
    assert index.match(full) == {R0: 2, R1: 3}
    assert index.entries == 5
    assert len(index) == 3
    index.remove_blocks(ReplicaId("unknown"), full)  # unknown replica: no-op
    assert index.entries == 5


def test_evictions_count_only_capacity_drops() -> None:
    index = PrefixIndex(default_capacity_blocks=2)
    index.insert(R0, chain(1, 2, 3))  # 1 eviction
    index.remove_blocks(R0, chain(1))
    index.clear_replica(R0)
    index.insert(R1, chain(4, 5))
    index.remove_replica(R1)
    assert index.evictions == 1


def test_entries_and_len_count_differently() -> None:
    index = PrefixIndex()
    shared = chain(1, 2, 3)
    index.insert(R0, shared)
    index.insert(R1, shared)
    index.insert(R2, chain(4))
    assert len(index) == 4  # distinct hashes
    assert index.entries == 7  # (replica, block) pairs


def test_clear_unknown_replica_is_a_no_op_like_remove() -> None:
    index = PrefixIndex()
    index.clear_replica(ReplicaId("never-added"))  # remove_replica/remove_blocks are no-ops here
    assert index.replicas == []


@pytest.mark.parametrize("case", ["suffix", "continuation_then_eviction"])
def test_inserting_a_chain_that_does_not_start_at_the_root_never_over_matches(case: str) -> None:
    # An engine's BlockStored event names only the newly stored blocks of a prompt, so the
    # events adapter inserts chains that continue an earlier one instead of starting at block 0.
    full = chain(0, 1, 2, 3, 4, 5)
    if case == "suffix":
        index = PrefixIndex()
        index.insert(R0, full[:2])
        index.insert(R0, full[4:], from_root=False)
    else:
        index = PrefixIndex(default_capacity_blocks=3)
        index.insert(R0, full[:2])
        index.insert(R0, full[2:3], from_root=False)  # the parent is now older than its child
        index.insert(R0, chain(99))  # one over capacity: evicts full[1], keeps full[2]
    held = [index.holds(R0, h) for h in full]
    expected = held.index(False) if False in held else len(full)
    assert index.match(full).get(R0, 0) == expected


def test_holder_map_switches_on_past_the_replica_threshold() -> None:
    from prefixroute.core.index import HOLDER_MAP_REPLICAS

    index = PrefixIndex()
    names = [ReplicaId(f"n{i}") for i in range(HOLDER_MAP_REPLICAS + 1)]
    long, short = chain(*range(40)), chain(*range(3))
    for r in names[:-1]:
        index.add_replica(r)
        index.insert(r, short)
    index.insert(names[0], long)
    assert not index.has_holder_map
    index.add_replica(names[-1])
    assert index.has_holder_map
    # Built from what was already held: the replica with the long chain is found alone.
    assert index.deepest_holders(long, 4) == {names[0]: 40}
    assert index.deepest_holders(short, 4) == {}  # all 64 hold it: too many to take
    assert PrefixIndex(holder_map=False).has_holder_map is False


def test_deepest_holders_without_the_map_raises() -> None:
    with pytest.raises(ConfigError, match="holder map"):
        PrefixIndex(holder_map=False).deepest_holders(chain(1, 2), 4)
    with pytest.raises(ConfigError, match="holder_stride"):
        PrefixIndex(holder_stride=0)


def test_stale_holders_are_swept_so_the_map_stays_bounded() -> None:
    from prefixroute.core.index import HOLDER_SWEEP_MIN

    index = PrefixIndex(8, holder_map=True, holder_stride=1)
    index.add_replica(R0)
    for i in range(HOLDER_SWEEP_MIN // 4 + 10):
        index.insert(R0, chain(i, i + 1, i + 2, i + 3))  # evicts the previous chains
    assert index.blocks_of(R0) == 8
    recorded = sum(len(s) for s in index._holders.values())  # type: ignore[union-attr]
    assert recorded < HOLDER_SWEEP_MIN + 16


@pytest.mark.parametrize("compiled", [True, False])
def test_an_empty_chain_touches_nothing(compiled: bool) -> None:
    lru = lru_factory(compiled)(3)
    assert lru.touch([]) == 0
    assert len(lru) == 0
    assert lru.match([]) == 0


@pytest.mark.parametrize("capacity", [None, 50, 10_000])
def test_the_reference_lru_queue_stays_bounded(capacity: int | None) -> None:
    """_lru's docstring: stale queue entries are dropped, by eviction or by compaction once the
    queue holds four times the live entries (plus 4,096), so memory stays bounded however often
    the same blocks are touched."""
    lru = ReplicaLRU(capacity)
    chains = [chain(k, 1, 2, 3, 4, 5, 6, 7) for k in range(20)]
    for i in range(3_000):
        lru.touch(chains[i % len(chains)])
        queued = sum(len(hashes) for hashes, _ in lru.queue)
        assert queued == lru.queued  # the count it compacts on is the true count
        assert queued <= COMPACT_FACTOR * len(lru) + COMPACT_MIN + 8
