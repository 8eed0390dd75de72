"""A replica that turns a request away (full, refusing it, unreachable) computed none of it: the
router takes back what the decision added to the index (``Router.withdraw``,
``core/routed_blocks.py``), and only that, and only while nothing could depend on it."""

from __future__ import annotations

import pytest

from prefixroute.core import BlockHasher, PrefixIndex, ReplicaId, Router, make_policy

R0, R1 = ReplicaId("r0"), ReplicaId("r1")
PROMPT = list(range(1000, 1064))  # 64 tokens: 4 blocks of 16


def router(policy: str = "round_robin") -> Router:
    r = Router(make_policy(policy), BlockHasher(16))
    r.add_replica(R0)
    r.add_replica(R1)
    return r


def send(r: Router, rid: str, tokens: list[int], to: ReplicaId, now: float = 0.0) -> int:
    """Route ``tokens`` to ``to`` only; returns the blocks the index predicted cached there."""
    decision = r.route(r.view(rid, tokens=tokens), now, [to])
    assert decision.replica == to
    return decision.predicted_cached_tokens // 16


def test_a_turned_away_request_leaves_no_blocks_behind() -> None:
    r = router()
    send(r, "a", PROMPT, R0)
    assert r.indexed_blocks(R0) == 4
    r.withdraw("a")
    r.complete("a", 1.0)
    assert r.indexed_blocks(R0) == 0
    assert r.index_withdrawals() == 4
    assert send(r, "b", PROMPT, R0) == 0  # the next one is not told it is cached there


def test_blocks_held_before_the_decision_stay() -> None:
    r = router()
    send(r, "a", PROMPT, R0)
    r.complete("a", 1.0)  # served: its blocks are the replica's
    longer = PROMPT + list(range(5000, 5032))  # 2 blocks more
    assert send(r, "b", longer, R0, now=2.0) == 4
    r.withdraw("b")
    assert r.indexed_blocks(R0) == 4 and r.index_withdrawals() == 2
    assert send(r, "c", longer, R0, now=3.0) == 4  # the earlier prompt is still there
    r.withdraw("c")  # a second one: the count adds up
    assert r.indexed_blocks(R0) == 4 and r.index_withdrawals() == 4


def test_a_served_request_is_never_taken_back() -> None:
    r = router()
    send(r, "a", PROMPT, R0)
    r.complete("a", 1.0)
    r.withdraw("a")  # too late: it ended, and what it computed stays
    assert r.indexed_blocks(R0) == 4 and r.index_withdrawals() == 0


def test_nothing_is_taken_once_another_chain_went_to_that_replica() -> None:
    """The later chain continues these blocks: taking them would leave its tail without its
    head, and the index's binary search would miss what it holds."""
    r = router()
    send(r, "a", PROMPT, R0)
    send(r, "b", PROMPT + list(range(5000, 5016)), R0)
    r.withdraw("a")
    assert r.indexed_blocks(R0) == 5 and r.index_withdrawals() == 0
    send(r, "c", list(range(7000, 7032)), R1)  # another replica's chains change nothing here
    r.withdraw("b")
    assert r.indexed_blocks(R0) == 4  # b's own block went; a's stayed under it
    assert send(r, "d", PROMPT, R0) == 3  # all of it held (less the last token, computed)


def test_a_request_that_added_nothing_takes_nothing() -> None:
    r = router()
    send(r, "a", PROMPT, R0)
    r.complete("a", 1.0)
    send(r, "a", PROMPT, R0)  # the same id again, all of it held already
    r.withdraw("a")
    assert r.indexed_blocks(R0) == 4 and r.index_withdrawals() == 0


def test_every_policy_routes_and_withdraws_through_the_same_path() -> None:
    for name in ("predicted_ttft", "cache_aware", "least_loaded"):
        r = router(name)
        decision = r.route(r.view("a", tokens=PROMPT), 0.0)
        r.withdraw("a")
        r.complete("a", 0.5)
        assert r.indexed_blocks(decision.replica) == 0, name


@pytest.mark.parametrize("compiled", [True, False])
def test_the_index_takes_back_only_an_undisturbed_tail(compiled: bool) -> None:
    index = PrefixIndex(compiled=compiled)
    chain = [11, 12, 13, 14]
    index.insert(R0, chain[:2])
    index.insert(R0, chain)
    mark = index.mark(R0)
    with pytest.raises(KeyError):
        index.mark(ReplicaId("unknown"))
    assert index.withdraw(R0, chain[2:], mark) == 2
    assert index.match(chain) == {R0: 2}
    index.insert(R0, chain)
    stale = index.mark(R0)
    index.insert(R0, [99])  # another chain since the mark
    assert index.withdraw(R0, chain[2:], stale) == 0
    assert index.match(chain) == {R0: 4}
    index.clear_replica(R0)  # new entries: the mark no longer names them
    index.insert(R0, chain)
    assert index.withdraw(R0, chain[2:], stale) == 0
    mark = index.mark(R0)
    index.remove_blocks(R0, [14])  # an engine's removal: matched by a walk from now on
    assert index.withdraw(R0, chain[2:], mark) == 0 and index.match(chain) == {R0: 3}


def test_a_replica_removed_meanwhile_has_nothing_to_take_back() -> None:
    r = router()
    send(r, "a", PROMPT, R0)
    r.remove_replica(R0)
    r.withdraw("a")
    r.add_replica(R0)  # back, with no entries: nothing of the old ones comes back either
    assert r.indexed_blocks(R0) == 0 and r.index_withdrawals() == 0


def test_another_instances_request_is_withdrawn_by_its_id_and_only_while_counted() -> None:
    # prefixroute.sync passes the remote request's key when it counts it as load (so that
    # complete ends it): then its blocks can be withdrawn; without a key they are an entry only.
    r = router()
    chain = r.view("x", tokens=PROMPT).block_hashes
    r.remote_routed(R0, chain[:2], 0.0, request_id="other/a")  # served: stays
    r.remote_dispatch("other/a", R0, prompt_tokens=32, output_tokens=1,
                      predicted_cached_tokens=0, now=0.0)  # fmt: skip
    r.complete("other/a", 1.0)
    r.remote_routed(R0, chain, 1.0, request_id="other/b")
    assert r.indexed_blocks(R0) == 4
    r.withdraw("other/b")
    assert r.indexed_blocks(R0) == 2 and r.index_withdrawals() == 2
    r.withdraw("other/a")  # ended: its blocks stay
    assert r.indexed_blocks(R0) == 2
    r.remote_routed(R1, chain, 2.0)  # no key: nothing kept to withdraw
    r.withdraw("")
    assert r.indexed_blocks(R1) == 4 and r.index_withdrawals() == 2


def test_in_precise_mode_another_instances_request_is_never_an_index_entry() -> None:
    # The engines' events own a precise index: a remote decision, keyed or not, is a
    # speculative entry only, and there is nothing of it to withdraw.
    r = Router(make_policy("round_robin"), BlockHasher(16), insert_on_route=False,
               speculative_ttl_s=60.0)  # fmt: skip
    r.add_replica(R0)
    chain = r.view("x", tokens=PROMPT).block_hashes
    r.remote_routed(R0, chain, 0.0, request_id="other/a")
    assert r.index_entries() == 0 and r.speculative_entries() == 4
    r.withdraw("other/a")
    assert r.index_withdrawals() == 0  # nothing in the index; its speculative entries go
    assert r.speculative_entries() == 0


def precise() -> Router:
    r = Router(make_policy("round_robin"), BlockHasher(16), insert_on_route=False,
               speculative_ttl_s=60.0)  # fmt: skip
    r.add_replica(R0)
    r.add_replica(R1)
    return r


def test_in_precise_mode_a_turned_away_request_leaves_no_speculative_entry() -> None:
    # The engine never computed it, so no KV event will come: for the rest of the TTL the
    # prefix's next requests would be sent back to the full replica, predicted cached.
    r = precise()
    send(r, "a", PROMPT, R0)
    assert r.speculative_entries() == 4
    r.withdraw("a")
    r.complete("a", 1.0)
    assert r.speculative_entries() == 0
    assert send(r, "b", PROMPT, R0, now=2.0) == 0  # not predicted cached there


def test_speculative_entries_held_before_or_refreshed_since_stay() -> None:
    r = precise()
    send(r, "a", PROMPT, R0)  # served: 4 entries, living out their TTL
    r.complete("a", 1.0)
    longer = PROMPT + list(range(5000, 5032))  # 2 blocks more
    send(r, "b", longer, R0, now=2.0)
    assert r.speculative_entries() == 6
    r.withdraw("b")
    assert r.speculative_entries() == 4  # a's stay
    assert send(r, "c", longer, R0, now=3.0) == 4
    send(r, "d", longer, R0, now=4.0)  # refreshes all six after c's decision
    r.withdraw("c")
    assert r.speculative_entries() == 6  # d's decision holds them now
    longest = longer + list(range(6000, 6016))  # 1 block more
    send(r, "e", longest, R0, now=5.0)
    r.complete("e", 6.0)
    r.withdraw("e")  # ended: too late, its block stays
    assert r.speculative_entries() == 7


def test_in_precise_mode_a_replica_removed_meanwhile_has_nothing_to_take_back() -> None:
    r = precise()
    send(r, "a", PROMPT, R0)
    r.remove_replica(R0)  # its entries went with it
    r.withdraw("a")
    r.complete("a", 1.0)
    assert r.speculative_entries() == 0
    r.add_replica(R0)
    assert send(r, "b", PROMPT, R0, now=2.0) == 0
