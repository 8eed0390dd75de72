"""What the subscriber tests share: one replica, a 4-token block hasher, and ways to build
events, wire frames and subscribers without repeating them in every test file."""

from __future__ import annotations

import zmq.asyncio

from prefixroute.core import BlockHasher, PrefixIndex, ReplicaId
from prefixroute.events import (
    BlockStored,
    EventEndpoint,
    EventSubscriber,
    KVEvent,
    KVEventBatch,
    PreciseIndexer,
    encode_batch,
    pack_frames,
)

R = ReplicaId("r")
BS = 4
HASHER = BlockHasher(BS)
NOWHERE = EventEndpoint("tcp://127.0.0.1:1", False)  # never started: tests feed receive() by hand
BIND_ANY = "bind:tcp://127.0.0.1:*"


def stored(tokens: list[int], parent: int | None, hashes: list[int]) -> BlockStored:
    return BlockStored(hashes, parent, tokens, BS, None, "GPU", None)


def block(i: int, parent: int | None) -> BlockStored:
    """Block ``i`` of one chain: tokens 4i..4i+3, engine hash i + 1."""
    return stored(list(range(4 * i, 4 * i + 4)), parent, [i + 1])


def payload(*events: KVEvent) -> bytes:
    return encode_batch(KVEventBatch(0.0, list(events)))


def frames(seq: int, *events: KVEvent) -> list[bytes]:
    return list(pack_frames(b"", seq, payload(*events)))


def indexed() -> PrefixIndex:
    """An index that knows replica ``R``."""
    index = PrefixIndex()
    index.add_replica(R)
    return index


def subscriber(
    context: zmq.asyncio.Context,
    endpoint: EventEndpoint | str = NOWHERE,
    index: PrefixIndex | None = None,
    **kwargs: float,
) -> EventSubscriber:
    """A subscriber for ``R`` into ``index`` (a fresh one that knows ``R`` if none is given);
    a string endpoint is parsed as the CLI would."""
    if isinstance(endpoint, str):
        endpoint = EventEndpoint.parse(endpoint)
    indexer = PreciseIndexer(R, indexed() if index is None else index, HASHER)
    return EventSubscriber(endpoint, indexer, context, **kwargs)
