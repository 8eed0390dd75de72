"""Reading a published batch, whichever form its events take and whatever types it carries.

Decoders, cheapest first (the forms: ``_wire.py``, ``_wire_other.py``):

1. vLLM's map form, every batch of a current vLLM in one call;
2. the positional form (vLLM before maps, SGLang before maps), then SGLang's map form, each a
   whole batch in one call once the ones before it failed;
3. event by event, for a batch that none reads whole: one that carries an event of a type we
   do not know (a newer engine's). That event is skipped and named to the caller, and the rest
   of its batch is applied:
   rejecting the batch would lose its stores, and the sequence gap it leaves would clear the
   replica's entries, on every batch that carries the new type. An event of a type we know
   that does not read is an error for the whole batch, as before.
"""

from __future__ import annotations

from typing import Any

import msgspec

from prefixroute.events._errors import EventDecodeError
from prefixroute.events._wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)
from prefixroute.events._wire_other import ArrayEvent, LooseEvent, MapBatch, OtherBatch, to_vllm

_VLLM_EVENTS = (BlockStored, BlockRemoved, AllBlocksCleared)  # read as they are
KNOWN_TYPES = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})


# Stateless and reusable: constants.
_vllm_batch = msgspec.msgpack.Decoder(KVEventBatch)
_other_batches = (
    msgspec.msgpack.Decoder(OtherBatch[ArrayEvent]),
    msgspec.msgpack.Decoder(OtherBatch[LooseEvent]),
    msgspec.msgpack.Decoder(MapBatch[KVEvent]),  # the batch itself a map (MapBatch)
    msgspec.msgpack.Decoder(MapBatch[LooseEvent]),
)
_raw_batch = msgspec.msgpack.Decoder(OtherBatch[msgspec.Raw])
_vllm_event = msgspec.msgpack.Decoder(KVEvent)
_other_events = (msgspec.msgpack.Decoder(ArrayEvent), msgspec.msgpack.Decoder(LooseEvent))
_any = msgspec.msgpack.Decoder()


def read_batch(payload: bytes) -> tuple[KVEventBatch, list[str]]:
    """The batch in a msgpack payload, in the map form's classes, and the type names of the
    events skipped as unknown (in order); raises EventDecodeError."""
    try:
        return _read_batch(payload)
    except RecursionError:  # msgspec's, on a few KB of nesting: a bad payload like any other
        raise EventDecodeError("not a vLLM KV-event batch: nested too deeply") from None


def _read_batch(payload: bytes) -> tuple[KVEventBatch, list[str]]:
    try:
        return _vllm_batch.decode(payload), []
    except msgspec.DecodeError as exc:
        first = exc
    for decoder in _other_batches:
        try:
            batch = decoder.decode(payload)
        except msgspec.DecodeError:
            continue
        events = [e if isinstance(e, _VLLM_EVENTS) else to_vllm(e) for e in batch.events]
        return KVEventBatch(batch.ts, events, batch.data_parallel_rank), []
    return _event_by_event(payload, first)


def decode_batch(payload: bytes) -> KVEventBatch:
    """:func:`read_batch`'s batch alone (events of unknown types left out)."""
    return read_batch(payload)[0]


def _event_by_event(payload: bytes, first: msgspec.DecodeError) -> tuple[KVEventBatch, list[str]]:
    try:
        raw = _raw_batch.decode(payload)
    except msgspec.DecodeError:
        raise EventDecodeError(f"not a vLLM KV-event batch: {first}") from first
    events: list[KVEvent] = []
    unknown: list[str] = []
    for item in raw.events:
        event = _event(item)
        if event is None:
            kind = _type_name(item)
            if kind is None or kind in KNOWN_TYPES:
                raise EventDecodeError(f"not a vLLM KV-event batch: {first}") from first
            unknown.append(kind)
        else:
            events.append(event)
    return KVEventBatch(raw.ts, events, raw.data_parallel_rank), unknown


def _event(raw: msgspec.Raw) -> KVEvent | None:
    """One event in any form (None: none reads it)."""
    try:
        return _vllm_event.decode(raw)
    except msgspec.DecodeError:
        pass
    for decoder in _other_events:
        try:
            return to_vllm(decoder.decode(raw))
        except msgspec.DecodeError:
            continue
    return None


def _type_name(raw: msgspec.Raw) -> str | None:
    """The event's type name, where it has one: the ``type`` of a map, the first element of
    an array (None: no name there)."""
    try:
        value: Any = _any.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(value, dict):
        kind = value.get("type")
    elif isinstance(value, list) and value:
        kind = value[0]
    else:
        return None
    return kind if isinstance(kind, str) else None
