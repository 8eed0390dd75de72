"""The other forms of the KV-event wire format that engines send, read into vLLM's classes.

vLLM's own form (``_wire.py``) is a named-field map per event. Two others are in use:

* **Positional:** each event an array, the class name first, then the fields in declaration
  order, trailing defaults left out. vLLM sent this before vllm-project/vllm#42892 (its
  ``BlockStored``: ``block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, ...``), and SGLang before sgl-project/sglang#37482 (its ``BlockStored`` stops at
  ``lora_id`` or ``medium``, then, for a salted or session-tagged store, a metadata map where
  vLLM has ``lora_name``; its ``BlockRemoved`` may stop at ``block_hashes``).
* **SGLang's map:** named fields like vLLM's, but ``BlockStored`` has no ``lora_name`` (which
  vLLM's form requires) and carries ``cache_salt`` and ``session_id`` as fields of its own.

Fields were only ever appended, so the positional twins keep vLLM's current order, every field
after ``block_size`` defaulting to None: a shorter array fills the leading fields, and msgspec
ignores trailing elements a newer engine adds. A salt, in whichever place an engine puts it,
becomes an ``extra_keys`` entry, as vLLM reports a salted block: tokens alone do not identify
such a block, so the indexer skips it instead of indexing it as unsalted. :func:`to_vllm`
turns a twin into vLLM's class, so nothing past the decoder knows which form came.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from prefixroute.events._wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEvent,
)

_E = TypeVar("_E")


# --- positional -------------------------------------------------------------------------------
class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the positional twins (a tagged union on the class name, as the map form)."""


class _ArrayBlockStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | dict[str, Any] | None = None  # a map here: SGLang's metadata
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class _ArrayBlockRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _ArrayAllBlocksCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


ArrayEvent = _ArrayBlockStored | _ArrayBlockRemoved | _ArrayAllBlocksCleared


class OtherBatch(msgspec.Struct, Generic[_E], array_like=True, omit_defaults=True, gc=False):
    """vLLM's ``EventBatch`` (unchanged in every form) of events of another form."""

    ts: float
    events: list[_E]
    data_parallel_rank: int | None = None


class MapBatch(msgspec.Struct, Generic[_E], omit_defaults=True, gc=False):
    """The batch as a map of named fields, should an engine send it so: vLLM 0.32 and every
    engine seen send it as an array, but a copy of vLLM's module declared it without
    ``array_like`` (an outside audit, 2026-12-06), so it is read too, after the others."""

    ts: float
    events: list[_E]
    data_parallel_rank: int | None = None


# --- SGLang's map -----------------------------------------------------------------------------
# The positional twins' fields, by name: every field after ``block_size`` may be missing.
class _LooseBlockStored(_ArrayBlockStored, array_like=False):
    cache_salt: str | None = None


class _LooseBlockRemoved(_ArrayBlockRemoved, array_like=False):
    pass


LooseEvent = _LooseBlockStored | _LooseBlockRemoved | AllBlocksCleared


def to_vllm(event: ArrayEvent | LooseEvent) -> KVEvent:
    """vLLM's event with the same fields (a salt as ``extra_keys``: module docstring)."""
    if isinstance(event, AllBlocksCleared):
        return event
    if isinstance(event, _ArrayAllBlocksCleared):
        return AllBlocksCleared()
    if isinstance(event, _ArrayBlockRemoved | _LooseBlockRemoved):
        return BlockRemoved(event.block_hashes, event.medium, group_idx=event.group_idx)
    named: str | dict[str, Any] | None = event.lora_name
    lora_name, salt = (None, named.get("cache_salt")) if isinstance(named, dict) else (named, None)
    if isinstance(event, _LooseBlockStored):
        salt = event.cache_salt
    extra_keys = event.extra_keys
    if salt is not None:
        extra_keys = [("cache_salt", salt)] * len(event.block_hashes)
    return BlockStored(
        event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size,
        event.lora_id, event.medium, lora_name, extra_keys=extra_keys, group_idx=event.group_idx,
    )  # fmt: skip


_encoder = msgspec.msgpack.Encoder()  # stateless and reusable: a constant


def encode_array_batch(ts: float, events: list[KVEvent]) -> bytes:
    """A batch as an engine of the positional form sends it (an emulated older engine)."""
    twins: list[ArrayEvent] = []
    for e in events:
        if isinstance(e, BlockStored):
            twins.append(_ArrayBlockStored(**msgspec.structs.asdict(e)))
        elif isinstance(e, BlockRemoved):
            twins.append(_ArrayBlockRemoved(**msgspec.structs.asdict(e)))
        else:
            twins.append(_ArrayAllBlocksCleared())
    return _encoder.encode(OtherBatch(ts, twins))
