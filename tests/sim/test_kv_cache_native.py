"""The compiled KV block pool (core/_native/kvcache.c) against its reference, answer by answer.

``sim/kv_cache.py``'s :class:`KVCache` is the specification. A state machine drives both with the
same valid operations, as a replica issues them (acquire a chain, register its computed blocks,
release it; the single-block calls too; reset), on small capacities so eviction is constant, and
compares every answer, every counter and the stored/removed event lists, whose order shows the
LRU order. Skipped when the extension is not built or ``PREFIXROUTE_PURE_PYTHON=1`` is set.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from prefixroute.core import BlockHash, CompiledKVCache
from prefixroute.sim.kv_cache import BlockPool, KVCache, make_kv_cache

pytestmark = pytest.mark.skipif(CompiledKVCache is None, reason="the compiled KV pool is off")

# Few keys, edges included, so chains share prefixes, repeat blocks and collide in the table.
KEYS = [BlockHash(k) for k in (0, 1, 2, 3, 5, 8, 2**63, 2**64 - 1, 12345678901234567, 42, 7)]
chains = st.lists(st.sampled_from(KEYS), min_size=1, max_size=6)


class Holder:
    """One running request's blocks, the same in both pools."""

    def __init__(self, hashes: list[BlockHash], hit: int, blocks: int) -> None:
        self.hashes = hashes
        self.cached = hashes[:hit]
        self.registered = hit
        self.anonymous = blocks - hit


class SamePool(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.native: BlockPool = make_kv_cache(1)
        self.python: BlockPool = KVCache(1)
        self.running: list[Holder] = []

    @initialize(capacity=st.integers(min_value=1, max_value=12), record=st.booleans())
    def make(self, capacity: int, record: bool) -> None:
        self.native = make_kv_cache(capacity, record)
        self.python = make_kv_cache(capacity, record, compiled=False)
        assert type(self.native) is not type(self.python)

    def both(self, name: str, *args: object) -> object:
        a = getattr(self.native, name)(*args)
        b = getattr(self.python, name)(*args)
        assert a == b, name
        return a

    @rule(hashes=chains, limit=st.integers(min_value=-2, max_value=7), extra=st.integers(0, 3))
    def acquire(self, hashes: list[BlockHash], limit: int, extra: int) -> None:
        blocks = len(hashes) + extra
        hit = self.both("acquire", hashes, limit, blocks)
        assert isinstance(hit, int)
        if hit >= 0:
            self.running.append(Holder(hashes, hit, blocks))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def register(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.running))
        stop = data.draw(st.integers(req.registered, len(req.hashes)))
        duplicates = self.both("register_chain", req.hashes, req.registered, stop)
        assert isinstance(duplicates, list)
        new = [i for i in range(req.registered, stop) if i not in duplicates]
        req.cached += [req.hashes[i] for i in new]
        req.anonymous -= len(new)
        req.registered = stop

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(self.running))
        self.running.remove(req)
        self.both("release", req.cached, req.anonymous)

    @rule(hashes=chains, limit=st.integers(min_value=-2, max_value=7))
    def lookup(self, hashes: list[BlockHash], limit: int) -> None:
        n = self.both("lookup", hashes, limit)
        assert isinstance(n, int)
        self.both("idle_among", hashes[:n])

    @rule(n=st.integers(min_value=0, max_value=4))
    def take_and_give_back(self, n: int) -> None:
        """take() alone, its blocks freed again at once (an anonymous request's)."""
        if n > self.python.available():
            with pytest.raises(ValueError):
                self.native.take(n)
            with pytest.raises(ValueError):
                self.python.take(n)
            return
        self.both("take", n)
        self.both("release", [], n)

    @rule()
    def reset(self) -> None:
        self.both("reset")

    @rule()
    def drain(self) -> None:
        for pool in (self.native, self.python):
            pool.stored, pool.removed = [], []

    @invariant()
    def same_state(self) -> None:
        a, b = self.native, self.python
        assert (a.capacity, a.free, a.evictions) == (b.capacity, b.free, b.evictions)
        assert (a.used, a.cached_blocks, a.available()) == (b.used, b.cached_blocks, b.available())
        assert (a.stored, a.removed) == (b.stored, b.removed)


SamePool.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestSamePool = SamePool.TestCase


def test_bad_calls_raise_as_the_reference_does() -> None:
    """A hash not cached is a KeyError in pin, idle_among and release; one that is not an int in
    [0, 2**64) is simply not cached for lookup, and refused elsewhere."""
    native = make_kv_cache(4)
    for call in (
        lambda: native.pin([BlockHash(9)]),
        lambda: native.idle_among([BlockHash(9)]),
        lambda: native.release([BlockHash(9)], 0),
    ):
        with pytest.raises(KeyError):
            call()
    assert native.lookup(["x", -1], 2) == 0  # type: ignore[list-item]
    with pytest.raises((TypeError, OverflowError)):
        native.register(-1)  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        native.register_chain([BlockHash(1)], 0, 2)


def test_the_switch_gives_the_reference() -> None:
    assert isinstance(make_kv_cache(4, compiled=False), KVCache)
    assert not isinstance(make_kv_cache(4), KVCache)


@pytest.mark.parametrize("length", [511, 512, 513, 3000])
def test_long_chains_give_the_same_answers(length: int) -> None:
    """Chains past the C's on-stack key buffer (512 keys) take a heap one: same answers."""
    chain = [BlockHash((k * 0x9E3779B97F4A7C15) % 2**64) for k in range(length)]
    pools = [make_kv_cache(length + 2, True), make_kv_cache(length + 2, True, compiled=False)]
    answers = []
    for pool in pools:
        first = pool.acquire(chain, length, length + 1)
        duplicates = pool.register_chain(chain, 0, length)
        pool.release(chain, 1)
        again = pool.acquire(chain, length - 1, length + 2)
        answers.append((first, duplicates, again, pool.used, pool.available(), pool.stored))
    assert answers[0] == answers[1]
    assert answers[0][:5] == (0, [], length - 1, length + 2, 0)


def test_the_environment_switch_turns_the_compiled_pool_off() -> None:
    """``PREFIXROUTE_PURE_PYTHON=1`` (read once, at import) makes every replica use the
    reference, as it does for the rest of the hot path (DEVELOPERS.md)."""
    code = (
        "from prefixroute.sim.replica import ReplicaModel\n"
        "print(type(ReplicaModel().cache).__module__)\n"
    )
    env = {**os.environ, "PREFIXROUTE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "prefixroute.sim.kv_cache", out.stderr
