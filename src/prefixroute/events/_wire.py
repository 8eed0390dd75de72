"""vLLM's KV-event wire format: msgspec Structs mirroring ``vllm/distributed/kv_events.py``.

The classes, field names, field order and Struct options are vLLM 0.32's, so our decoder reads
what vLLM sends and our emulated replica sends what vLLM's own decoder reads:

* ``EventBatch`` is ``array_like``: a batch is the msgpack array ``[ts, events]`` (plus
  ``data_parallel_rank`` when set; ``omit_defaults`` drops it when ``None``).
* Events are a tagged union (``tag=True``): each is a msgpack map whose ``"type"`` key holds the
  class name, ``"BlockStored"``, ``"BlockRemoved"`` or ``"AllBlocksCleared"``; ``omit_defaults``
  leaves out fields still at their defaults. Unknown keys (fields newer vLLMs add) are ignored.
  Engines that send each event as an array instead (SGLang, vLLM before maps) are read too
  (``_wire_other``), and events of types we do not know are skipped (``_decode``).
* Block hashes are ``ExternalBlockHash = bytes | int``: vLLM sends the low 64 bits of its hash as
  an int unless ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``. We never interpret them: they are
  opaque keys, mapped to our own hashes of the token ids (see ``_indexer``).

A message on the wire is three ZMQ frames: topic, an 8-byte big-endian sequence number, and the
msgpack payload. vLLM's replay socket answers with the same three frames and ends with
sequence ``-1`` and an empty payload, hence the signed decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from prefixroute.events._errors import EventDecodeError

ExternalBlockHash = bytes | int
"""An engine's block hash as published; opaque to us."""

MEDIUM_GPU = "GPU"  # the engine's own KV cache; other media (CPU, STORAGE) are offload tiers
END_SEQ = -1  # the replay socket's end-of-replay sequence number


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float  # engine wall-clock time of the batch, seconds since the epoch
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the KV-cache events (a tagged union on the class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]  # the newly stored full blocks, in order
    parent_block_hash: ExternalBlockHash | None  # block before the first; None at the root
    token_ids: list[int]  # the blocks' tokens, len(block_hashes) * block_size ids
    block_size: int  # tokens per block
    lora_id: int | None  # deprecated in vLLM in favour of lora_name
    medium: str | None  # "GPU" for the engine's cache; None from older engines
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None  # per block: mm, salt, LoRA keys
    group_idx: int | None = None  # KV-cache group (hybrid models)
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]  # blocks evicted from the cache
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The engine dropped its whole prefix cache (``reset_prefix_cache``)."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared

_encoder = msgspec.msgpack.Encoder()  # stateless and reusable: a constant


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def pack_frames(topic: bytes, seq: int, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """The three frames of one published batch."""
    return topic, seq.to_bytes(8, "big", signed=seq < 0), payload


def unpack_frames(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """``(topic, seq, payload)`` from a published message; raises EventDecodeError."""
    if len(frames) != 3:
        raise EventDecodeError(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    topic, seq, payload = frames
    return bytes(topic), decode_seq(seq), bytes(payload)


def decode_seq(raw: bytes) -> int:
    """An 8-byte big-endian sequence number (-1 is the replay's end marker)."""
    if len(raw) != 8:
        raise EventDecodeError(f"a sequence number is 8 bytes, got {len(raw)}")
    return int.from_bytes(raw, "big", signed=True)
