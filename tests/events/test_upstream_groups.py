"""What vLLM's own producers send beside a plain GPU store, checked against the indexer
(an events audit against vllm-project/vllm, 2026-12; each test failed on the code before).

* Hybrid models (sliding-window or Mamba layers beside full attention) publish one event per
  KV-cache group. ``BlockPool._emit_block_removed_events`` (vllm/v1/core/block_pool.py, since
  vllm-project/vllm#37688 "Enable GPU-side KV events for HMA") sends
  ``BlockRemoved(block_hashes=[maybe_convert_block_hash(get_block_hash(key))],
  group_idx=get_group_id(key))``: the hash is the group-less block hash, the same one every
  group reports for the same tokens, and "vLLM can evict Sliding Window Attention blocks while
  retaining the full-attention blocks" (#37688's description).
* The CPU offloading connector, unless ``self_describing_kv_events`` is set, publishes
  placeholder stores: ``OffloadingEventsTracker._placeholder_stored``
  (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py) sends
  ``BlockStored(token_ids=[], block_size=0, medium="CPU", parent_block_hash=None, ...)``.
"""

from __future__ import annotations

import logging

import pytest

from prefixroute.core import BlockHasher, PrefixIndex, ReplicaId
from prefixroute.events import BlockRemoved, BlockStored, KVEventBatch, PreciseIndexer

R = ReplicaId("r")
BS = 4
TOKENS = list(range(8))


def make() -> tuple[PrefixIndex, PreciseIndexer, BlockHasher]:
    index, hasher = PrefixIndex(), BlockHasher(BS)
    index.add_replica(R)
    return index, PreciseIndexer(R, index, hasher), hasher


def gpu_store(group: int, block_size: int = BS) -> BlockStored:
    return BlockStored(
        [11, 12], None, TOKENS, block_size, None, "GPU", None, [None, None], group_idx=group
    )


def test_a_removal_in_another_group_keeps_the_full_attention_groups_block() -> None:
    index, ix, hasher = make()
    # Group 0 (full attention) and group 1 (sliding window) both cache the two blocks, under
    # the same engine hashes; then the window slides and group 1 evicts the first one.
    ix.apply(KVEventBatch(0.0, [gpu_store(0), gpu_store(1)]))
    ix.apply(KVEventBatch(0.0, [BlockRemoved([11], "GPU", group_idx=1)]))
    assert index.match(hasher.hash_tokens(TOKENS)) == {R: 2}  # group 0 still holds both
    ix.apply(KVEventBatch(0.0, [BlockRemoved([11], "GPU", group_idx=0)]))
    assert index.match(hasher.hash_tokens(TOKENS)) == {}  # and now it does not


def test_a_cpu_placeholder_store_is_skipped_without_a_block_size_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    index, ix, _ = make()
    placeholder = BlockStored([11], None, [], 0, None, "CPU", None, group_idx=0)
    with caplog.at_level(logging.ERROR):
        ix.apply(KVEventBatch(0.0, [placeholder]))
    assert ix.stats.skipped_blocks == 1
    assert not caplog.records  # 0-token CPU blocks say nothing about the GPU block size
    with caplog.at_level(logging.ERROR):
        ix.apply(KVEventBatch(0.0, [gpu_store(0, block_size=16)]))  # a real mismatch...
    assert "16-token blocks" in caplog.text  # ...is still reported


def test_another_groups_block_size_is_no_block_size_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, ix, _ = make()
    with caplog.at_level(logging.ERROR):
        ix.apply(KVEventBatch(0.0, [gpu_store(1, block_size=2)]))  # a Mamba-like group
    assert ix.stats.skipped_blocks == 2
    assert not caplog.records
