"""The compiled hot path (core/_native) against its pure-Python references, answer by answer.

Both are fed the same operations: the block hasher's ``hash_tokens``/``hash_text`` with
``known=`` and ``parent=``, and the index's insert (from the root or not), match, remove_blocks,
remove_replica and clear_replica under capacities that evict. Every answer must be equal: the
Python code is the specification (core/hashing.py, core/_lru.py). Skipped when the extension is
not built or ``PREFIXROUTE_PURE_PYTHON=1`` switches it off (test_native_backend.py checks
the switch).
"""

from __future__ import annotations

import random
import warnings
from array import array
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from prefixroute.core import (
    BlockHash,
    BlockHasher,
    ConfigError,
    PrefixIndex,
    ReplicaId,
    _native,
)
from prefixroute.core._lru import ReplicaLRU

pytestmark = pytest.mark.skipif(_native.LRU is None, reason="the compiled hot path is off")

token_ids = st.integers(min_value=0, max_value=2**32 - 1)
seeds = st.integers(min_value=0, max_value=2**64 - 1)
# A small pool of keys, edges included, so chains share blocks, repeat them, and collide in the
# table; not chained hashes: the LRU must hold for any keys, closed under prefixes or not.
KEYS = [BlockHash(k) for k in (0, 1, 2, 3, 5, 8, 2**63, 2**64 - 1, 12345678901234567, 42)]
key_chains = st.lists(st.sampled_from(KEYS), max_size=8)
NAMES = [ReplicaId(f"r{i}") for i in range(3)]
capacities = st.none() | st.integers(min_value=1, max_value=6)


def pair(block_size: int, seed: int = 0) -> tuple[BlockHasher, BlockHasher]:
    return BlockHasher(block_size, seed), BlockHasher(block_size, seed, compiled=False)


@given(
    tokens=st.lists(token_ids, max_size=80),
    block_size=st.integers(min_value=1, max_value=9),
    seed=seeds,
    data=st.data(),
)
def test_token_hashes_are_identical(
    tokens: list[int], block_size: int, seed: int, data: st.DataObject
) -> None:
    native, python = pair(block_size, seed)
    assert native.hash_tokens(tokens) == python.hash_tokens(tokens)
    array = np.array(tokens, dtype=np.uint32)
    assert native.hash_tokens(array) == python.hash_tokens(array)
    cut = data.draw(st.integers(min_value=0, max_value=len(tokens)), label="cut")
    # known: a true earlier turn, or any list the caller vouches for (trusted, not checked)
    known = data.draw(
        st.just(python.hash_tokens(tokens[:cut])) | st.lists(st.sampled_from(KEYS), max_size=12),
        label="known",
    )
    assert native.hash_tokens(tokens, known) == python.hash_tokens(tokens, known)
    parent = data.draw(st.none() | seeds.map(BlockHash), label="parent")
    assert native.hash_tokens(tokens, parent=parent) == python.hash_tokens(tokens, parent=parent)


@given(text=st.text(max_size=60), block_size=st.integers(min_value=1, max_value=7), seed=seeds)
def test_text_hashes_are_identical(text: str, block_size: int, seed: int) -> None:
    native, python = pair(block_size, seed)
    assert native.hash_text(text) == python.hash_text(text)
    half = python.hash_text(text[: len(text) // 2])
    assert native.hash_text(text, half) == python.hash_text(text, half)


@given(salt=st.text(max_size=12), adapter=st.text(max_size=12), tokens=st.lists(token_ids))
def test_salted_and_adapter_hashers_stay_compiled_and_identical(
    salt: str, adapter: str, tokens: list[int]
) -> None:
    native, python = pair(2, 9)
    for a, b in (
        (native.salted(salt), python.salted(salt)),
        (native.for_adapter(adapter).salted(salt), python.for_adapter(adapter).salted(salt)),
    ):
        assert (a.compiled, b.compiled) == (True, False)  # derived hashers keep their backend
        assert a.hash_tokens(tokens) == b.hash_tokens(tokens)


def outcome(fn: Callable[[], bytes | None]) -> bytes | None | type[Exception]:
    try:
        return fn()
    except (OverflowError, TypeError) as exc:
        return type(exc)


@given(
    ids=st.lists(
        st.integers(min_value=-3, max_value=2**32 + 3)
        | st.integers(min_value=0, max_value=2**32 - 1).map(np.uint32)
        | st.integers(min_value=-(2**40), max_value=2**40).map(np.int64)
        | st.booleans()
        | st.just(1.0),
        max_size=12,
    )
)
def test_token_lists_pack_as_an_array_does_with_its_errors(ids: list[object]) -> None:
    pack = _native.pack_u32
    assert pack is not None
    expected = outcome(lambda: array("I", ids).tobytes())  # type: ignore[type-var]
    assert outcome(lambda: pack(ids)) == expected
    assert outcome(lambda: pack(tuple(ids))) == expected


DTYPES = ["u1", "u2", "u4", ">u4", "i1", "i2", "<i4", "i8", ">i8", "u8", "f8", "?"]


def hashed(hasher: BlockHasher, tokens: object) -> list[BlockHash] | type[Exception]:
    try:
        return hasher.hash_tokens(tokens)  # type: ignore[arg-type]
    except (ConfigError, ValueError) as exc:
        return type(exc)


@given(
    ids=st.lists(st.integers(min_value=0, max_value=2**33), max_size=12)
    | st.lists(st.integers(min_value=-(2**33), max_value=2**33), max_size=12),
    dtype=st.sampled_from(DTYPES),
    step=st.sampled_from([1, 2, -1]),
)
def test_any_container_packs_as_the_python_path_does(ids: list[int], dtype: str, step: int) -> None:
    """Arrays of every integer dtype and byte order, strided views, and the containers the
    compiled packer leaves to Python (floats, bools, 2-d arrays, bytes): same hashes or error."""
    native, python = pair(2)
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy warns when an id does not fit the dtype
        array_ids = np.array(ids).astype(dtype)[::step]
    containers: list[object] = [array_ids, array_ids.reshape(-1, 1), ids, tuple(ids)]
    containers += [bytes(i % 256 for i in ids), memoryview(bytes(i % 256 for i in ids))]
    for tokens in containers:
        assert hashed(native, tokens) == hashed(python, tokens), (tokens, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "ids", [[0, 1, 2, 3], [2**32 - 1, 5], [2**32, 1], [3, -1], [2**31, 2**31 + 1, 255, 256]]
)
def test_every_dtype_at_the_uint32_edges(ids: list[int], dtype: str) -> None:
    native, python = pair(1)
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokens = np.array(ids).astype(dtype)
    assert hashed(native, tokens) == hashed(python, tokens)


def test_known_hashes_are_trusted_by_the_compiled_loop_too() -> None:
    native, python = pair(1)
    fake = [BlockHash(2**64 - 1)]
    assert native.hash_tokens([1, 2, 3], fake) == python.hash_tokens([1, 2, 3], fake)
    assert native.hash_tokens([1, 2, 3], fake)[0] == fake[0]


class IndexPair(RuleBasedStateMachine):
    """One PrefixIndex of each backend, fed the same operations; every answer compared."""

    @initialize(default=capacities, holder_map=st.booleans())
    def setup(self, default: int | None, holder_map: bool) -> None:
        self.native = PrefixIndex(default, holder_map=holder_map, holder_stride=2)
        self.python = PrefixIndex(default, holder_map=holder_map, holder_stride=2, compiled=False)
        self.chains: list[list[BlockHash]] = [[]]

    @rule(r=st.sampled_from(NAMES), capacity=capacities)
    def add_replica(self, r: ReplicaId, capacity: int | None) -> None:
        self.native.add_replica(r, capacity)
        self.python.add_replica(r, capacity)

    @rule(r=st.sampled_from(NAMES), hashes=key_chains, from_root=st.booleans())
    def insert(self, r: ReplicaId, hashes: list[BlockHash], from_root: bool) -> None:
        self.chains.append(hashes)
        got = self.native.insert(r, hashes, from_root=from_root)
        assert got == self.python.insert(r, hashes, from_root=from_root)

    @rule(r=st.sampled_from(NAMES), doomed=st.lists(st.sampled_from(KEYS), max_size=3))
    def remove_blocks(self, r: ReplicaId, doomed: list[BlockHash]) -> None:
        self.native.remove_blocks(r, doomed)
        self.python.remove_blocks(r, doomed)

    @rule(r=st.sampled_from(NAMES))
    def remove_replica(self, r: ReplicaId) -> None:
        self.native.remove_replica(r)
        self.python.remove_replica(r)

    @rule(r=st.sampled_from(NAMES), capacity=st.integers(1, 40))
    def resize_replica(self, r: ReplicaId, capacity: int) -> None:
        assert self.native.resize_replica(r, capacity) == self.python.resize_replica(r, capacity)

    @rule(r=st.sampled_from(NAMES))
    def clear_replica(self, r: ReplicaId) -> None:
        self.native.clear_replica(r)
        self.python.clear_replica(r)

    @invariant()
    def same_answers(self) -> None:
        n, p = self.native, self.python
        for hashes in self.chains:
            assert n.match(hashes) == p.match(hashes)
            assert n.match(hashes, NAMES[1:]) == p.match(hashes, NAMES[1:])
            assert n.match_each(hashes, NAMES) == p.match_each(hashes, NAMES)
            if p.has_holder_map:
                for limit in (1, 3):
                    assert n.deepest_holders(hashes, limit) == p.deepest_holders(hashes, limit)
        for r in NAMES:
            assert n.blocks_of(r) == p.blocks_of(r)
            assert [n.holds(r, h) for h in KEYS] == [p.holds(r, h) for h in KEYS]
        assert (len(n), n.entries, n.evictions) == (len(p), p.entries, p.evictions)
        assert n.gapped_replicas == p.gapped_replicas
        assert sorted(n.replicas) == sorted(p.replicas)


IndexPair.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestIndexPair = IndexPair.TestCase


@pytest.mark.parametrize("capacity", [None, 1, 37, 600])
def test_long_random_runs_agree(capacity: int | None) -> None:
    """Thousands of touches over a larger key space: table growth, deletions that shift probe
    runs, and queue compaction (past its 4,096-touch floor) happen here, not in short runs."""
    rng = random.Random(capacity)
    pool = [BlockHash(rng.getrandbits(64)) for _ in range(1_500)]
    pool += [BlockHash(k) for k in range(64)]  # small keys crowd the same home slots
    assert _native.LRU is not None
    native, python = _native.LRU(capacity), ReplicaLRU(capacity)
    for step in range(3_000):
        chain = rng.sample(pool, rng.randint(0, 24))
        assert native.touch(chain) == python.touch(chain)
        if step % 7 == 0:
            doomed = rng.choice(pool)
            assert native.discard(doomed) == python.discard(doomed)
        if step % 11 == 0:
            native.gapped = python.gapped = not native.gapped
        if capacity is not None and step % 13 == 0:
            smaller = rng.randint(1, capacity)
            assert native.resize(smaller) == python.resize(smaller)
            assert native.capacity == python.capacity == smaller
        probe = rng.sample(pool, 6) if step % 2 else chain
        for known in (0, 1, 3):
            assert native.match(probe, known) == python.match(probe, known)
        assert len(native) == len(python)
    assert sorted(native.blocks()) == sorted(python.blocks())
    assert all((h in native) == (h in python) for h in pool)


@pytest.mark.parametrize("lrus", [0, 1, 16, 64, 65, 200])
def test_one_chain_against_many_lrus_in_one_call(lrus: int) -> None:
    """``match_each`` (a decision's candidates at once, their binary searches side by side) is
    ``[lru.match(chain) for lru in lrus]`` of the reference, 0 for None: past 64 LRUs too (its
    other buffer), gapped ones walked, keys that are not block hashes never held."""
    assert _native.LRU is not None and _native.match_each is not None
    rng = random.Random(lrus)
    roots = [[BlockHash(rng.getrandbits(64)) for _ in range(rng.randint(1, 40))] for _ in range(6)]
    natives: list[object] = []
    pythons: list[ReplicaLRU | None] = []
    for i in range(lrus):
        if i % 9 == 4:
            natives.append(None)
            pythons.append(None)
            continue
        capacity = rng.choice([None, 3, 50, 400])
        native, python = _native.LRU(capacity), ReplicaLRU(capacity)
        for _ in range(rng.randint(0, 12)):
            chain = rng.choice(roots)[: rng.randint(1, 40)]
            chain = chain + [BlockHash(rng.getrandbits(64)) for _ in range(rng.randint(0, 30))]
            native.touch(chain)
            python.touch(chain)
        if i % 5 == 2 and len(python):
            doomed = rng.choice(sorted(python.stamps))
            native.discard(doomed)
            python.discard(doomed)
            native.gapped = python.gapped = True
        natives.append(native)
        pythons.append(python)
    for _ in range(60):
        probe: list[object] = list(rng.choice(roots)[: rng.randint(0, 40)])
        probe += [BlockHash(rng.getrandbits(64)) for _ in range(rng.randint(0, 20))]
        if rng.random() < 0.2:
            probe.insert(rng.randint(0, len(probe)), rng.choice([-1, 2**64, "x", 1.0]))
        want = [p.match(probe) if p is not None else 0 for p in pythons]  # type: ignore[arg-type]
        assert _native.match_each(natives, probe) == want  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compiled LRUs"):
        _native.match_each([ReplicaLRU(None)], [BlockHash(1)])


@pytest.mark.parametrize("length", [511, 512, 513, 2_000])
def test_chains_longer_than_the_stack_buffer_match_as_the_reference(length: int) -> None:
    """A chain of up to 512 blocks is matched in a buffer on the C stack, a longer one in an
    allocated one (``match.h``): at, around and far past that edge, ``LRU.match`` and
    ``match_each`` answer as the reference, from the root and given ``known`` blocks held."""
    assert _native.LRU is not None and _native.match_each is not None
    rng = random.Random(length)
    chain = [BlockHash(rng.getrandbits(64)) for _ in range(length)]
    natives, pythons = [], []
    for held in (length, length - 1, length // 2, 1, 0):
        native, python = _native.LRU(None), ReplicaLRU(None)
        native.touch(chain[:held])
        python.touch(chain[:held])
        natives.append(native)
        pythons.append(python)
        for known in (0, 1, held, length):
            assert native.match(chain, known) == python.match(chain, known)
        assert native.match(chain) == held
    assert _native.match_each(natives, chain) == [p.match(chain) for p in pythons]
    assert _native.match_each(natives, chain[:3]) == [p.match(chain[:3]) for p in pythons]


def test_distinct_blocks_counts_a_block_held_by_many_once() -> None:
    """``distinct_blocks`` (``len(PrefixIndex)`` with compiled LRUs) is the size of the union of
    the LRUs' blocks: shared blocks once, the 64-bit edges included, empty LRUs adding nothing."""
    assert _native.LRU is not None and _native.distinct_blocks is not None
    rng = random.Random(7)
    pool = [BlockHash(rng.getrandbits(64)) for _ in range(3_000)]
    pool += [BlockHash(0), BlockHash(2**64 - 1)]
    lrus = []
    for i in range(40):
        lru = _native.LRU(rng.choice([None, 10, 500]))
        for _ in range(i % 7):
            lru.touch(rng.sample(pool, rng.randint(1, 200)))
        lrus.append(lru)
    union: set[int] = set().union(*(lru.blocks() for lru in lrus))
    assert _native.distinct_blocks(lrus) == len(union) > 0
    assert _native.distinct_blocks([]) == 0
    with pytest.raises(TypeError, match="compiled LRUs"):
        _native.distinct_blocks([ReplicaLRU(None)])


def test_the_compiled_lru_refuses_what_is_not_a_block_hash() -> None:
    """Keys are 64-bit: anything else is an error on insert, and simply not held elsewhere,
    as ``x in dict`` is False for it."""
    assert _native.LRU is not None
    lru = _native.LRU(4)
    lru.touch([BlockHash(1), BlockHash(2)])
    bads: list[object] = [-1, 2**64, "x", 1.0]
    for bad in bads:
        with pytest.raises((OverflowError, TypeError)):
            lru.touch([BlockHash(3), bad])  # type: ignore[list-item]
        assert bad not in lru
        assert not lru.discard(bad)  # type: ignore[arg-type]
    assert sorted(lru.blocks()) == [1, 2]  # a refused chain changed nothing
    assert lru.match([BlockHash(1), "x"]) == 1  # type: ignore[list-item]
