"""Tests for prefixroute.events._indexer: engine events -> our index, keyed by token ids."""

from __future__ import annotations

from prefixroute.core import BlockHash, BlockHasher, PrefixIndex, ReplicaId, Router, make_policy
from prefixroute.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    PreciseIndexer,
    decode_batch,
    unpack_frames,
)
from prefixroute.gateway import HFTokenizer

from .fixture import TOKENIZER, load

R = ReplicaId("r")
BS = 4


def stored(
    tokens: list[int], parent: int | None, hashes: list[int] | None = None, **kw: object
) -> BlockStored:
    n = len(tokens) // BS
    fields: dict[str, object] = {"lora_id": None, "medium": "GPU", "lora_name": None, **kw}
    return BlockStored(  # type: ignore[arg-type]
        hashes if hashes is not None else [1000 + i for i in range(n)],
        parent,
        tokens,
        int(fields.pop("block_size", BS)),  # type: ignore[call-overload]
        **fields,
    )


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=list(events))


def make() -> tuple[PrefixIndex, PreciseIndexer, BlockHasher]:
    index, hasher = PrefixIndex(), BlockHasher(BS)
    index.add_replica(R)
    return index, PreciseIndexer(R, index, hasher), hasher


def test_blocks_are_keyed_by_our_hash_of_their_tokens_not_the_engines() -> None:
    index, ix, hasher = make()
    tokens = list(range(12))
    ix.apply(batch(stored(tokens[:8], None, [0xAA, 0xBB])))  # engine hashes: arbitrary
    ix.apply(batch(stored(tokens[8:], 0xBB, [0xCC])))  # a continuation, parent named
    ours = hasher.hash_tokens(tokens)
    assert index.match(ours) == {R: 3}
    assert ix.stats.stored_blocks == 3 and ix.stats.orphan_blocks == 0
    assert not index.holds(R, BlockHash(0xAA))


def test_a_store_of_no_blocks_changes_nothing() -> None:
    """A well-formed BlockStored with no blocks (vLLM never sends one; another publisher
    might) stores nothing: it failed on its parents list and cleared the replica's index."""
    index, ix, hasher = make()
    tokens = list(range(8))
    ix.apply(batch(stored(tokens, None, [0xAA, 0xBB])))
    ix.apply(batch(stored([], 0xBB, [])))
    ix.apply(batch(stored([], None, [])))
    assert index.match(hasher.hash_tokens(tokens)) == {R: 2}
    assert ix.stats.stored_blocks == 2 and ix.stats.stored_events == 3


def test_removal_maps_engine_hashes_to_ours() -> None:
    index, ix, hasher = make()
    tokens = list(range(12))
    ix.apply(batch(stored(tokens, None, [1, 2, 3])))
    ix.apply(batch(BlockRemoved([3, 99], "GPU")))  # 99 was never stored
    assert index.match(hasher.hash_tokens(tokens)) == {R: 2}
    ix.apply(batch(BlockRemoved([1], "GPU")))  # the root: nothing matches from the start
    assert index.match(hasher.hash_tokens(tokens)) == {}
    assert ix.stats.removed_blocks == 2 and ix.stats.unknown_removals == 1
    assert len(ix) == 1


def test_an_event_whose_parent_we_never_saw_is_left_out() -> None:
    index, ix, _ = make()
    ix.apply(batch(stored(list(range(8)), 12345)))
    assert index.blocks_of(R) == 0
    assert ix.stats.orphan_blocks == 2


def test_all_blocks_cleared_forgets_the_replica() -> None:
    index, ix, hasher = make()
    ix.apply(batch(stored(list(range(8)), None, [1, 2])))
    ix.apply(batch(AllBlocksCleared(), stored(list(range(50, 54)), None, [7])))
    assert index.blocks_of(R) == 1
    assert index.match(hasher.hash_tokens(list(range(50, 54)))) == {R: 1}
    ix.apply(batch(stored(list(range(8, 12)), 2)))  # parent 2 was cleared: an orphan now
    assert ix.stats.orphan_blocks == 1 and ix.stats.cleared_events == 1


def test_blocks_tokens_do_not_identify_are_skipped() -> None:
    index, ix, _ = make()
    t = list(range(4))
    ix.apply(
        batch(
            stored(t, None, [1], medium="CPU"),  # an offload tier
            stored(t, None, [3], lora_id=7),  # an adapter by number only (older vLLM)
            stored(t, None, [4], extra_keys=[("salt",)]),  # cache_salt / multimodal
            # an adapter's block with another key beside its name (a salt, an image)
            stored(t, None, [2], lora_name="a", lora_id=1, extra_keys=[("a", "salt")]),
            stored(t, None, [5], group_idx=1),
            stored(t * 2, None, [6], block_size=8),  # another block size than ours
            stored(t[:3], None, [8]),  # tokens do not fill the blocks named
        )
    )
    assert index.blocks_of(R) == 0
    assert ix.stats.skipped_blocks == 7
    ix.apply(batch(stored(t, None, [9], extra_keys=[None])))  # vLLM's "no extra keys"
    assert index.blocks_of(R) == 1


def test_a_replica_removed_from_the_index_is_not_brought_back() -> None:
    index, ix, _ = make()
    assert ix.index is index
    index.remove_replica(R)
    ix.apply(batch(stored(list(range(4)), None)))
    assert R not in index.replicas


def test_fed_to_a_router_the_events_go_through_its_engine_methods() -> None:
    """The gateway's precise mode: the indexer tells the Router, which owns its index."""
    hasher = BlockHasher(BS)
    router = Router(make_policy("round_robin"), hasher, insert_on_route=False)
    router.add_replica(R)
    ix = PreciseIndexer(R, router, hasher)
    assert ix.index is None  # nothing to reach into: the router is read through its methods
    tokens = list(range(12))
    ix.apply(batch(stored(tokens[:8], None, [0xAA, 0xBB]), stored(tokens[8:], 0xBB, [0xCC])))
    ours = hasher.hash_tokens(tokens)
    assert router.index.match(ours) == {R: 3}
    assert router.index.gapped_replicas == {R}  # the continuation was not from the root
    ix.apply(batch(BlockRemoved([0xCC], "GPU")))
    assert router.indexed_blocks(R) == 2
    ix.apply(batch(AllBlocksCleared()))
    assert router.indexed_blocks(R) == 0 and len(ix) == 0
    router.remove_replica(R)
    ix.apply(batch(stored(tokens[:4], None)))
    assert not router.has_replica(R) and R not in router.index.replicas


def test_on_real_vllm_events_our_prediction_equals_vllms_cached_tokens() -> None:
    """Replay the recorded stream into the indexer; before each recorded request, predict its
    cached tokens from our index (hashing our tokenization of its prompt) and compare with what
    vLLM reported in that request's usage."""
    rec = load()
    tokenizer = HFTokenizer(TOKENIZER)
    index, hasher = PrefixIndex(), BlockHasher(rec.block_size)
    index.add_replica(R)
    ix = PreciseIndexer(R, index, hasher)
    applied = 0
    compared = 0
    for request in rec.requests:
        for frames in rec.messages[applied : request["messages_before"]]:
            ix.apply(decode_batch(unpack_frames(frames)[2]))
        applied = max(applied, request["messages_before"])
        usage = request["usage"]
        if usage is None:  # /reset_prefix_cache
            continue
        body = request["body"]
        if "messages" in body:
            tokens = tokenizer.encode_chat(body["messages"])
        else:
            tokens = tokenizer.encode_prompt(body["prompt"])
        assert len(tokens) == usage["prompt_tokens"]  # tokenized exactly as vLLM did
        hashes = hasher.hash_tokens(tokens)
        matched = index.match(hashes).get(R, 0)
        predicted = min(matched, (len(tokens) - 1) // rec.block_size) * rec.block_size
        assert predicted == usage["prompt_tokens_details"]["cached_tokens"], request
        compared += 1
    assert compared >= 4
    assert ix.stats.orphan_blocks == 0 and ix.stats.removed_blocks > 0


def test_a_lora_adapters_blocks_are_keyed_by_the_adapter() -> None:
    """vLLM names the adapter in ``lora_name`` and puts it in every block's extra keys
    (``vllm/v1/core/kv_cache_utils.py``: ``_gen_lora_extra_hash_keys``): such blocks match the
    adapter's requests, never the base model's or another adapter's, continuations included."""
    index, ix, hasher = make()
    t = list(range(12))
    lora = {"lora_name": "a", "lora_id": 1}
    ix.apply(batch(stored(t[:8], None, [1, 2], extra_keys=[("a",), ("a",)], **lora)))
    ix.apply(batch(stored(t[8:], 2, [3], extra_keys=[("a",)], **lora)))  # a continuation
    ix.apply(batch(stored(t[:4], None, [4], lora_name="b", extra_keys=None)))  # no keys listed
    assert index.match(hasher.for_adapter("a").hash_tokens(t)) == {R: 3}
    assert index.match(hasher.for_adapter("b").hash_tokens(t)) == {R: 1}
    assert index.match(hasher.hash_tokens(t)) == {}
    assert index.match(hasher.for_adapter("c").hash_tokens(t)) == {}
    assert ix.stats.adapter_blocks == 4 and ix.stats.skipped_blocks == 0
    ix.apply(batch(BlockRemoved([3], "GPU")))  # removals map through the same table
    assert index.match(hasher.for_adapter("a").hash_tokens(t)) == {R: 2}


# --- chains remembered across a clear (an outside audit, 2026-12-06) -----------------------
# A prefix the engine keeps cached through a gap or a restart is never stored again; a new
# store that names one of its blocks as parent proves the engine holds it and its whole chain.


def test_a_chain_kept_through_a_clear_comes_back_under_a_new_store() -> None:
    index, ix, hasher = make()
    system = list(range(8))
    ix.apply(batch(stored(system, None, [1, 2])))
    ix.clear()  # a gap: nothing from before is trusted...
    assert index.blocks_of(R) == 0
    question = list(range(8, 12))
    ix.apply(batch(stored(question, 2, [3])))  # ...until a store hangs under it
    assert index.match(hasher.hash_tokens(system + question)) == {R: 3}
    assert ix.stats.recalled_blocks == 2 and ix.stats.orphan_blocks == 0
    ix.apply(batch(BlockRemoved([1], "GPU")))  # the recalled blocks are mapped again: removable
    assert index.match(hasher.hash_tokens(system)) == {}


def test_a_block_evicted_after_the_clear_is_not_brought_back() -> None:
    index, ix, _ = make()
    ix.apply(batch(stored(list(range(8)), None, [1, 2])))
    ix.clear()
    ix.apply(batch(BlockRemoved([2], "GPU")))  # the engine says it no longer holds it
    ix.apply(batch(stored(list(range(8, 12)), 2, [3])))
    assert index.blocks_of(R) == 0 and ix.stats.orphan_blocks == 1


def test_an_engine_that_emptied_its_cache_brings_nothing_back() -> None:
    index, ix, _ = make()
    ix.apply(batch(stored(list(range(8)), None, [1, 2])))
    ix.clear()
    ix.apply(batch(AllBlocksCleared()))  # empty: what it holds next, it stores again
    ix.apply(batch(stored(list(range(8, 12)), 2, [3])))
    assert index.blocks_of(R) == 0 and ix.stats.recalled_blocks == 0


def test_a_loop_of_parents_from_before_a_clear_ends() -> None:
    index, ix, _ = make()
    ix.apply(batch(stored(list(range(4)), None, [5])))
    ix.apply(batch(stored(list(range(4, 8)), 5, [6])))
    ix.apply(batch(stored(list(range(8, 12)), 6, [5])))  # 5 stored again under 6: a loop
    ix.clear()
    ix.apply(batch(stored(list(range(12, 16)), 5, [7])))
    assert ix.stats.orphan_blocks == 1 and ix.stats.recalled_blocks == 0


def test_a_store_whose_tokens_are_not_whole_blocks_is_skipped() -> None:
    """One block hash with 6 tokens at 4 a block: the counts disagree, and the event cannot
    say which block the extra tokens belong to (an outside audit: it was indexed as one)."""
    index, ix, _ = make()
    ix.apply(batch(stored(list(range(6)), None, [1])))
    assert index.blocks_of(R) == 0 and ix.stats.skipped_blocks == 1


def test_only_the_engines_own_clear_drops_a_routers_speculative_entries() -> None:
    """AllBlocksCleared says the engine emptied its cache with nothing running: the router's
    speculative entries for that replica go (core/router.py ``engine_cleared``). A clear of
    ours (a gap, a restart) keeps them."""
    router = Router(make_policy("round_robin"), BlockHasher(BS), insert_on_route=False,
                    speculative_ttl_s=5.0)  # fmt: skip
    router.add_replica(R)
    ix = PreciseIndexer(R, router, router.hasher)
    chain = router.hasher.hash_tokens(list(range(8)))
    router.remote_routed(R, chain, 1.0)
    spec = router.speculative
    assert spec is not None
    ix.clear()
    assert spec.match(chain, [R], 1.5) == {R: 2}
    ix.apply(batch(AllBlocksCleared()))
    assert spec.match(chain, [R], 1.5) == {}


def test_a_full_report_brings_back_a_prefix_whose_first_report_was_lost() -> None:
    """vLLM reports only newly cached blocks; with ``kv_cache_report_mode: full``
    (gateway/_kv_report.py) it reports a request's cached prefix again from its root. Lost
    first, the prefix and everything later stored under it were unknown (orphans); reported
    again, it is indexed, and a report of blocks already held changes nothing."""
    index, ix, hasher = make()
    prompt = list(range(12))
    ix.apply(batch(stored(prompt[8:], 2, [3])))  # its parents' batch was lost: an orphan
    assert index.blocks_of(R) == 0 and ix.stats.orphan_blocks == 1
    ix.apply(batch(stored(prompt, None, [1, 2, 3])))  # the full report, from the root
    assert index.match(hasher.hash_tokens(prompt)) == {R: 3}
    stored_before = ix.stats.stored_blocks
    ix.apply(batch(stored(prompt, None, [1, 2, 3])))  # again: held, nothing to do
    assert ix.stats.repeated_blocks == 3 and ix.stats.stored_blocks == stored_before
    assert index.match(hasher.hash_tokens(prompt)) == {R: 3}
    ix.apply(batch(stored(prompt[4:8], 3, [2])))  # the same hash under another parent
    assert ix.stats.stored_blocks == stored_before + 1  # not "held": mapped anew
