"""Tests for prefixroute.core.speculative: short-lived entries for decisions not yet in events."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixroute.core import BlockHash, BlockHasher, ConfigError, ReplicaId, SpeculativeEntries

A, B = ReplicaId("a"), ReplicaId("b")
HASHER = BlockHasher(block_size=1)


def chain(*tokens: int) -> list[BlockHash]:
    return HASHER.hash_tokens(list(tokens))


def test_an_entry_matches_until_its_ttl_then_expires() -> None:
    spec = SpeculativeEntries(ttl_s=2.0)
    spec.add(A, chain(1, 2, 3), now=10.0)
    assert spec.match(chain(1, 2, 3, 4), [A, B], now=11.9) == {A: 3}
    assert spec.match(chain(1, 2, 3, 4), [A, B], now=12.0) == {}
    assert len(spec) == 0


def test_the_longest_prefix_is_found_per_replica() -> None:
    spec = SpeculativeEntries(ttl_s=5.0)
    spec.add(A, chain(1, 2, 3, 4, 5), now=0.0)
    spec.add(B, chain(1, 2), now=0.0)
    assert spec.match(chain(1, 2, 3, 9), [A, B], now=1.0) == {A: 3, B: 2}
    assert spec.match(chain(7, 2), [A, B], now=1.0) == {}
    assert spec.match([], [A, B], now=1.0) == {}


def test_a_later_decision_refreshes_the_shared_part_only() -> None:
    spec = SpeculativeEntries(ttl_s=2.0)
    spec.add(A, chain(1, 2, 3), now=0.0)
    spec.add(A, chain(1, 2, 8), now=1.5)  # refreshes blocks 1 and 2
    assert spec.match(chain(1, 2, 3), [A], now=2.5) == {A: 2}  # block 3 expired at 2.0
    assert spec.match(chain(1, 2, 8), [A], now=2.5) == {A: 3}
    assert spec.match(chain(1, 2, 8), [A], now=3.5) == {}


def test_removing_a_replica_forgets_its_entries_and_late_expiries_are_harmless() -> None:
    spec = SpeculativeEntries(ttl_s=1.0)
    spec.add(A, chain(1, 2), now=0.0)
    spec.remove_replica(A)
    assert spec.match(chain(1, 2), [A], now=0.5) == {}
    spec.add(A, chain(1, 2), now=0.6)  # re-added: the old queue entry must not delete this one
    assert spec.match(chain(1, 2), [A], now=1.2) == {A: 2}
    assert spec.blocks_of(A) == 2


def test_the_ttl_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        SpeculativeEntries(ttl_s=0.0)


@given(
    decisions=st.lists(
        st.tuples(
            st.sampled_from([A, B]),
            st.lists(st.integers(0, 3), min_size=1, max_size=6),
            st.floats(0.0, 1.0),
        ),
        max_size=20,
    ),
    probe=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    ttl=st.floats(0.1, 3.0),
)
def test_match_equals_a_brute_force_model(
    decisions: list[tuple[ReplicaId, list[int], float]], probe: list[int], ttl: float
) -> None:
    spec = SpeculativeEntries(ttl_s=ttl)
    model: dict[tuple[ReplicaId, BlockHash], float] = {}
    now = 0.0
    for replica, tokens, step in decisions:
        now += step
        hashes = chain(*tokens)
        spec.add(replica, hashes, now)
        for h in hashes:
            model[replica, h] = now + ttl
    now += 0.5
    hashes = chain(*probe)
    expected = {}
    for r in (A, B):
        m = 0
        while m < len(hashes) and model.get((r, hashes[m]), -1.0) > now:
            m += 1
        if m:
            expected[r] = m
    assert spec.match(hashes, [A, B], now) == expected
