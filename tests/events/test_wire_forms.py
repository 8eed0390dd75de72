"""The positional form of KV events (SGLang's publisher, vLLM before its events became maps) and
events of types we do not know: both read by ``read_batch`` (events/_decode.py)."""

from __future__ import annotations

import msgspec
import pytest
import zmq.asyncio

from prefixroute.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    StreamState,
    encode_array_batch,
    read_batch,
)

from .helpers import HASHER, R, block, indexed, payload, subscriber


# SGLang's classes as its publisher declares them (python/sglang/srt/disaggregation/
# kv_events.py): array-like events, tagged by class name, fewer fields than vLLM's.
class SglEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class SglStored(SglEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class SglRemoved(SglEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class SglCleared(SglEvent, tag="AllBlocksCleared"):
    pass


class SglBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[SglStored | SglRemoved | SglCleared]


def test_sglang_batches_read_as_vllm_events() -> None:
    sent = SglBatch(2.5, [SglCleared(), SglStored([5, 6], None, list(range(8)), 4, None),
                          SglRemoved([5])])  # fmt: skip
    batch, unknown = read_batch(msgspec.msgpack.encode(sent))
    assert unknown == []
    assert batch.ts == 2.5
    assert batch.events == [
        AllBlocksCleared(),
        BlockStored([5, 6], None, list(range(8)), 4, None, None, None),
        BlockRemoved([5], None),
    ]


def test_a_positional_batch_keeps_every_field_the_indexer_reads() -> None:
    """lora_id (a block the indexer must skip without lora_name), extra_keys (likewise),
    group_idx (a removal of another group's copy must not remove ours), and the batch's
    data-parallel rank."""
    stored = ["BlockStored", [9], None, [1, 2, 3, 4], 4, 3, "GPU", None, [["mm", 1]], 2]
    removed = ["BlockRemoved", [9], "GPU", 1]
    batch, _ = read_batch(msgspec.msgpack.encode([1.0, [stored, removed], 1]))
    got_stored, got_removed = batch.events
    assert isinstance(got_stored, BlockStored) and isinstance(got_removed, BlockRemoved)
    assert (got_stored.lora_id, got_stored.extra_keys, got_stored.group_idx) == (3, [("mm", 1)], 2)
    assert got_removed.group_idx == 1
    assert batch.data_parallel_rank == 1


def test_a_positional_event_with_more_fields_keeps_them_and_ignores_newer_ones() -> None:
    """vLLM's array-like BlockStored carried medium and lora_name after lora_id; a field that
    a newer engine appends past the ones we know is ignored, as the map form ignores keys."""
    stored = ["BlockStored", [9], 3, [1, 2, 3, 4], 4, None, "CPU", "ada", None, 1,
              "full_attention", None, None, None, None, {"a field": "from the future"}]
    batch, _ = read_batch(msgspec.msgpack.encode([1.0, [stored]]))
    (event,) = batch.events
    assert isinstance(event, BlockStored)
    assert (event.parent_block_hash, event.medium, event.lora_name, event.group_idx) == (
        3, "CPU", "ada", 1)  # fmt: skip


def test_our_positional_encoding_reads_back() -> None:
    events = [block(0, None), BlockRemoved([1], "GPU"), AllBlocksCleared()]
    batch, _ = read_batch(encode_array_batch(3.0, events))
    assert batch == KVEventBatch(3.0, events)
    sent = msgspec.msgpack.decode(encode_array_batch(3.0, events))[1]
    assert sent[1][:3] == ["BlockRemoved", [1], "GPU"]  # positional: the tag, then the fields


@pytest.mark.parametrize("positional", [False, True], ids=["map", "array"])
def test_an_event_of_an_unknown_type_is_skipped_and_named(positional: bool) -> None:
    newer: object = ["BlockPinned", [1], 7] if positional else {"type": "BlockPinned", "n": 7}
    known = block(0, None)
    raw = msgspec.msgpack.decode(
        encode_array_batch(0.0, [known]) if positional else payload(known)
    )
    raw[1] = [newer, raw[1][0], newer]
    raw[2:] = [3]  # a data-parallel rank
    raw[0] = 4.5
    batch, unknown = read_batch(msgspec.msgpack.encode(raw))
    assert batch == KVEventBatch(4.5, [known], 3)
    assert unknown == ["BlockPinned", "BlockPinned"]


def test_sglang_map_events_beside_an_unknown_type_are_still_read() -> None:
    """The event-by-event path tries every form, SGLang's map last."""
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(
        SglMapBatch(0.0, [SglMapStored([1], None, [1, 2, 3, 4], 4, None, "GPU")])))  # fmt: skip
    raw[1].append({"type": "BlockPinned"})
    batch, unknown = read_batch(msgspec.msgpack.encode(raw))
    assert batch.events == [BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", None)]
    assert unknown == ["BlockPinned"]


async def test_a_stream_with_unknown_events_keeps_its_blocks_and_its_place(
    context: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    """The known events of a batch that also carries a newer type are applied, the sequence
    goes on without a gap, and nothing is cleared: the count is all that changes, and the
    type is logged once, not once per batch."""
    sub = subscriber(context)
    newer = {"type": "BlockPinned", "block_hashes": [1]}

    def frames_with_newer(seq: int, *events: BlockStored) -> list[bytes]:
        raw = msgspec.msgpack.decode(payload(*events))
        raw[1].append(newer)
        return [b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode(raw)]

    await sub.receive(frames_with_newer(0, block(0, None)))
    await sub.receive(frames_with_newer(1, block(1, 1)))
    assert sub.stats.unknown_events == 2
    logged = [r for r in caplog.records if "unknown type 'BlockPinned'" in r.getMessage()]
    assert len(logged) == 1
    assert sub.stats.gaps == 0 and sub.stats.resyncs == {} and sub.stats.decode_errors == 0
    assert sub.state is StreamState.LIVE
    assert sub.indexer.index is not None
    assert sub.indexer.index.match(HASHER.hash_tokens(list(range(8)))) == {R: 2}


async def test_a_positional_stream_indexes_like_a_map_stream(
    context: zmq.asyncio.Context,
) -> None:
    index = indexed()
    sub = subscriber(context, index=index)
    await sub.receive([b"", (0).to_bytes(8, "big"),
                       encode_array_batch(0.0, [block(0, None), block(1, 1)])])  # fmt: skip
    assert index.match(HASHER.hash_tokens(list(range(8)))) == {R: 2}
    await sub.receive([b"", (1).to_bytes(8, "big"),
                       encode_array_batch(0.0, [BlockRemoved([2], None)])])  # fmt: skip
    assert index.match(HASHER.hash_tokens(list(range(8)))) == {R: 1}
    assert sub.stats.decode_errors == 0


# SGLang's classes since sgl-project/sglang#37482: named-field maps, no lora_name, the salt and
# session as fields of their own.
class SglMapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class SglMapStored(SglMapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None


class SglMapRemoved(SglMapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class SglMapBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[SglMapStored | SglMapRemoved | SglCleared]


def _seq(n: int) -> bytes:
    return n.to_bytes(8, "big")


async def test_sglang_map_events_are_indexed_and_a_salted_store_is_not(
    context: zmq.asyncio.Context,
) -> None:
    """A salted block is not the unsalted prompt's block: indexing it as one would promise
    other requests a cache they do not have (the indexer skips blocks tokens do not identify)."""
    index = indexed()
    sub = subscriber(context, index=index)
    tokens = list(range(8))
    salted = SglMapStored([1, 2], None, tokens, 4, None, "GPU", cache_salt="tenant-a")
    plain = SglMapStored([3, 4], None, tokens, 4, None, "GPU", session_id="s1")
    await sub.receive([b"", _seq(0), msgspec.msgpack.encode(SglMapBatch(0.0, [salted]))])
    assert index.blocks_of(R) == 0 and sub.indexer.stats.skipped_blocks == 2
    await sub.receive([b"", _seq(1), msgspec.msgpack.encode(SglMapBatch(0.0, [plain]))])
    assert index.match(HASHER.hash_tokens(tokens)) == {R: 2}
    removed = SglMapBatch(0.0, [SglMapRemoved([4])])
    await sub.receive([b"", _seq(2), msgspec.msgpack.encode(removed)])
    assert index.match(HASHER.hash_tokens(tokens)) == {R: 1}
    assert sub.stats.decode_errors == 0 and sub.stats.resyncs == {}


@pytest.mark.parametrize(
    ("metadata", "indexed_blocks"),
    [({"cache_salt": "tenant-a"}, 0), ({"session_id": "s1"}, 2)],
    ids=["salted", "session-only"],
)
async def test_sglang_positional_metadata_in_vllms_lora_name_place(
    context: zmq.asyncio.Context, metadata: dict[str, str], indexed_blocks: int
) -> None:
    """Positional SGLang put a metadata map where vLLM has ``lora_name``: a salt there makes
    the store unidentifiable by tokens, a session alone does not."""
    index = indexed()
    sub = subscriber(context, index=index)
    stored = ["BlockStored", [1, 2], None, list(range(8)), 4, None, "GPU", metadata]
    await sub.receive([b"", _seq(0), msgspec.msgpack.encode([0.0, [stored]])])
    assert index.blocks_of(R) == indexed_blocks
    assert sub.stats.decode_errors == 0


def test_a_batch_sent_as_a_map_reads_as_the_array_form() -> None:
    """vLLM 0.32 sends the batch as an array; a copy of its module declared it as a map of
    named fields (an outside audit, 2026-12-06), and an engine that sent that must not have
    every batch read as an error."""
    events = [block(0, None), block(1, 1)]
    as_map = msgspec.msgpack.encode({"ts": 0.0, "events": events, "data_parallel_rank": None})
    assert read_batch(as_map) == read_batch(payload(*events)) == (KVEventBatch(0.0, events), [])
