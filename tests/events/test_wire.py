"""Tests for prefixroute.events._wire: vLLM's KV-event format, on bytes a real vLLM sent."""

from __future__ import annotations

import msgspec
import pytest

from prefixroute.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    KVEventBatch,
    decode_batch,
    encode_batch,
    pack_frames,
    unpack_frames,
)

from .fixture import load

REC = load()


def batches() -> list[tuple[int, KVEventBatch]]:
    out = []
    for frames in REC.messages:
        topic, seq, payload = unpack_frames(frames)
        assert topic == b""  # vLLM's default topic
        out.append((seq, decode_batch(payload)))
    return out


def test_every_recorded_message_decodes_in_sequence() -> None:
    decoded = batches()
    seqs = [seq for seq, _ in decoded]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive, no gap
    kinds = [type(e).__name__ for _, b in decoded for e in b.events]
    assert {"BlockStored", "BlockRemoved", "AllBlocksCleared"} <= set(kinds)
    for _, batch in decoded:
        assert batch.ts > 1.7e9  # seconds since the epoch
        assert batch.data_parallel_rank == 0


def test_re_encoding_gives_vllms_bytes_back() -> None:
    """Our Structs mirror vLLM's field for field (order, tags, omitted defaults): what we encode
    is what vLLM's own decoder reads, which is what the emulated replica relies on."""
    for frames in REC.messages:
        payload = frames[2]
        assert encode_batch(decode_batch(payload)) == payload


def test_block_stored_carries_whole_blocks_and_chains_to_its_parent() -> None:
    stored = [e for _, b in batches() for e in b.events if isinstance(e, BlockStored)]
    hashes_seen: set[int | bytes] = set()
    for event in stored:
        assert event.block_size == REC.block_size == 32
        assert len(event.token_ids) == len(event.block_hashes) * event.block_size
        assert event.medium == "GPU" and event.lora_name is None and event.group_idx == 0
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in event.block_hashes)
        if event.parent_block_hash is not None:
            assert event.parent_block_hash in hashes_seen  # continues a chain we saw
        hashes_seen.update(event.block_hashes)


def test_the_layout_on_the_wire() -> None:
    """A batch is an array [ts, events, dp_rank]; an event is a map tagged by "type"."""
    payload = REC.messages[0][2]
    raw = msgspec.msgpack.decode(payload)
    assert isinstance(raw, list) and len(raw) == 3
    event = raw[1][0]
    assert event["type"] == "BlockStored"
    assert list(event)[:8] == [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ]


def test_round_trip_of_each_event_type() -> None:
    batch = KVEventBatch(
        ts=1.5,
        events=[
            BlockStored([1, b"\x02"], None, [7] * 8, 4, None, "GPU", None),
            BlockRemoved([1], "GPU"),
            AllBlocksCleared(),
        ],
    )
    frames = pack_frames(b"kv", 41, encode_batch(batch))
    topic, seq, payload = unpack_frames(list(frames))
    assert (topic, seq) == (b"kv", 41)
    assert decode_batch(payload) == batch


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgspec.msgpack.encode({}),
        msgspec.msgpack.encode([1.0, [{"type": "BlockStored"}]]),  # a known type, no fields
        msgspec.msgpack.encode([1.0, [["BlockRemoved"]]]),  # the same, positional
        msgspec.msgpack.encode([1.0, [7]]),  # an event with no type at all
        msgspec.msgpack.encode([1.0, [{"type": 5}]]),  # a type that is no name
    ],
    ids=["empty", "invalid", "not-an-array", "known-type-bad", "known-type-bad-array", "untyped",
         "type-not-a-name"],  # fmt: skip
)
def test_a_bad_payload_is_our_error(payload: bytes) -> None:
    with pytest.raises(EventDecodeError, match="^not a vLLM KV-event batch: ") as info:
        decode_batch(payload)
    assert isinstance(info.value.__cause__, msgspec.DecodeError)


def test_bad_frames_are_our_error() -> None:
    with pytest.raises(EventDecodeError):
        unpack_frames([b"", b"\x00" * 8])
    with pytest.raises(EventDecodeError):
        unpack_frames([b"", b"\x00" * 4, b""])
    assert unpack_frames([b"t", (-1).to_bytes(8, "big", signed=True), b""])[1] == -1
