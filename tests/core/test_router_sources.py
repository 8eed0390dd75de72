"""Every source of routing state goes through a Router method (core/router.py's docstring):
other router instances' decisions, engines' KV events, replicas' own reports; and the reads
that metrics, dashboards and reports make instead of reaching into the router's parts."""

from __future__ import annotations

import pytest

from prefixroute.core import BlockHash, BlockHasher, ReplicaId, Router, make_policy

A, B, GONE = ReplicaId("a"), ReplicaId("b"), ReplicaId("gone")
CHAIN = [BlockHash(h) for h in (11, 12, 13, 14)]


def approximate(**kwargs: object) -> Router:
    r = Router(make_policy("round_robin"), BlockHasher(block_size=1), **kwargs)  # type: ignore[arg-type]
    r.add_replica(A)
    r.add_replica(B)
    return r


def precise(ttl_s: float | None = 1.0) -> Router:
    return approximate(insert_on_route=False, speculative_ttl_s=ttl_s)


# --- other instances' decisions ---------------------------------------------------------------
def test_a_remote_decision_enters_the_index_in_approximate_mode_live_or_replayed() -> None:
    r = approximate()
    r.remote_routed(A, CHAIN, 0.0)
    r.remote_routed(B, CHAIN[:2], 0.0, live=False)  # from the history: an entry all the same
    assert r.index.match(CHAIN) == {A: 4, B: 2}
    assert r.speculative_entries() is None
    assert r.loads[A].in_flight == 0  # an index entry is not load


def test_a_remote_decision_is_a_speculative_entry_in_precise_mode_until_its_ttl() -> None:
    r = precise(ttl_s=1.0)
    r.remote_routed(A, CHAIN, 10.0)  # live by default
    assert r.index.entries == 0  # the engines' events own the index
    assert r.speculative is not None
    assert r.speculative.match(CHAIN, [A, B], 10.99) == {A: 4}
    assert r.speculative.match(CHAIN, [A, B], 11.0) == {}  # expired ttl_s after ``now``


def test_a_replayed_remote_decision_adds_nothing_in_precise_mode() -> None:
    r = precise()
    r.remote_routed(A, CHAIN, 0.0, live=False)
    assert r.speculative_entries() == 0 and r.index.entries == 0
    without = precise(ttl_s=None)  # precise mode with no speculative entries at all
    without.remote_routed(A, CHAIN, 0.0)
    assert without.index.entries == 0 and without.speculative_entries() is None


def test_an_empty_remote_decision_touches_nothing() -> None:
    r = precise(ttl_s=1.0)
    r.remote_routed(A, CHAIN, 0.0)
    r.remote_routed(B, [], 5.0)  # would expire A's entries if it reached them
    assert r.speculative_entries() == 4
    assert r.speculative is not None and r.speculative.blocks_of(B) == 0


def test_a_remote_request_counts_as_load_until_it_ends() -> None:
    r = approximate(kv_block_size=16)
    r.remote_dispatch(
        "other/q1", A, prompt_tokens=400, output_tokens=50, predicted_cached_tokens=100, now=3.0
    )
    load = r.replica_load(A)
    assert (load.in_flight, load.prefilling, load.queued_prefill_tokens) == (1, 1, 300)
    assert load.active_blocks == 29  # ceil((400 + 50) / 16)
    assert load.busy_since == 3.0
    assert r.replica_load(B).in_flight == 0
    r.first_token("other/q1", 4.0, measured=False)
    assert (load.in_flight, load.prefilling, load.queued_prefill_tokens) == (1, 0, 0)
    r.complete("other/q1", 5.0)
    assert (load.in_flight, load.completed) == (0, 1)


# --- engines' KV events -------------------------------------------------------------------------
def test_engine_events_store_evict_and_clear_a_replicas_blocks() -> None:
    r = precise()
    r.engine_stored(A, CHAIN)
    assert r.index.match(CHAIN) == {A: 4}
    assert r.index.gapped_replicas == frozenset()  # from the root by default
    r.engine_stored(B, CHAIN[:2])
    r.engine_stored(B, CHAIN[2:], from_root=False)  # a continuation
    assert r.index.gapped_replicas == frozenset({B})
    assert r.indexed_blocks(B) == 4
    r.engine_removed(A, CHAIN[3:])
    assert r.index.match(CHAIN) == {A: 3, B: 4}
    r.engine_cleared(B)
    assert r.indexed_blocks(B) == 0 and r.has_replica(B)  # cleared, still registered
    r.engine_stored(B, CHAIN)
    assert r.indexed_blocks(B) == 4  # and indexed again


def test_a_removed_replicas_late_events_are_dropped() -> None:
    r = precise()
    r.remove_replica(A)
    r.engine_stored(A, CHAIN)
    r.engine_stored(GONE, CHAIN)  # never registered
    assert A not in r.index.replicas and GONE not in r.index.replicas
    assert r.index_entries() == 0


# --- what replicas report about themselves --------------------------------------------------
def test_a_replicas_report_is_kept_field_by_field() -> None:
    r = approximate()
    load = r.replica_load(A)
    r.observe_replica(A, kv_usage=0.25)
    assert (load.kv_usage, load.num_waiting, load.num_running) == (0.25, None, None)
    r.observe_replica(A, num_waiting=3)
    r.observe_replica(A, num_running=7)
    assert (load.kv_usage, load.num_waiting, load.num_running) == (0.25, 3, 7)
    assert r.replica_load(B).kv_usage is None
    assert load.in_flight == 0  # beside the router's own accounting, never mixed in


# --- reads ----------------------------------------------------------------------------------------
def test_replica_load_is_the_routers_own_view() -> None:
    r = approximate()
    d = r.route(r.view("q", tokens=list(range(100))), 0.0)
    assert r.replica_load(d.replica) is r.loads[d.replica]
    assert r.replica_load(d.replica).in_flight == 1
    assert r.replica_load(GONE).in_flight == 0  # an unknown replica reads as idle


def test_queued_prefill_s_is_the_replicas_queue_at_its_learned_speed() -> None:
    r = approximate()
    r.route(r.view("q", tokens=list(range(5000))), 1.0, [A])
    expected = r.loads[A].queued_prefill_s(1.2)
    assert expected > 0
    assert r.queued_prefill_s(A, 1.2) == pytest.approx(expected)
    assert r.queued_prefill_s(A, 1.2) > r.queued_prefill_s(A, 1.4)  # work done meanwhile
    assert r.queued_prefill_s(B, 1.2) == 0.0


def test_index_reads_count_blocks_entries_and_evictions() -> None:
    r = approximate(index_capacity_blocks=3)
    r.engine_stored(A, CHAIN[:2])
    r.engine_stored(B, CHAIN[:3])
    assert (r.index_blocks(), r.index_entries(), r.index_evictions()) == (3, 5, 0)
    assert (r.indexed_blocks(A), r.indexed_blocks(B), r.indexed_blocks(GONE)) == (2, 3, 0)
    r.engine_stored(A, CHAIN)  # 4 blocks in a capacity of 3: the deepest one evicted
    assert (r.index_blocks(), r.index_entries(), r.index_evictions()) == (3, 6, 1)


def test_speculative_entries_count_until_dropped() -> None:
    r = precise(ttl_s=1.0)
    assert r.speculative_entries() == 0
    r.route(r.view("q", tokens=[1, 2, 3]), 0.0, [A])
    r.route(r.view("p", tokens=[1, 2]), 0.5, [B])
    assert r.speculative_entries() == 5
    assert approximate().speculative_entries() is None


def test_chars_per_token_are_the_learned_ones() -> None:
    r = approximate()
    assert r.chars_per_token() == {}
    view = r.view("q", text="x" * 600, model="m")
    r.route(view, 0.0)
    r.observe_usage("q", prompt_tokens=100, cached_tokens=None)
    learned = r.chars_per_token()
    assert set(learned) == {"m"}
    assert learned["m"].value == r.tokens.chars_per_token("m") != 4.0


def test_an_engine_that_emptied_its_cache_drops_its_speculative_entries_too() -> None:
    """vLLM sends AllBlocksCleared only when no request runs (its reset refuses otherwise), so
    the requests behind a replica's speculative entries are over and their blocks gone: the
    entries went on predicting them cached for the rest of their TTL (an outside audit,
    2026-12-07). A clear for a gap or a restart (not ``emptied``) keeps them: they stand for
    requests whose events may still come."""
    r = precise(ttl_s=2.0)
    r.remote_routed(A, CHAIN, 10.0)
    r.remote_routed(B, CHAIN, 10.0)
    spec = r.speculative
    assert spec is not None
    r.engine_cleared(A)  # a gap: entries kept
    assert spec.match(CHAIN, [A, B], 10.5) == {A: 4, B: 4}
    r.engine_cleared(A, emptied=True)
    assert spec.match(CHAIN, [A, B], 10.5) == {B: 4}
