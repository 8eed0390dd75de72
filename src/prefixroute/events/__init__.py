"""KV events from inference engines: vLLM's wire format, a subscriber per replica, the indexer.

The adapter between engines and the routing core (STYLE rule 12). Engines publish what their
prefix caches store and evict; this package decodes it (``read_batch``: vLLM's map form, or
the positional form of SGLang and earlier vLLMs), follows each replica's stream
(``EventSubscriber``: sequence numbers, replay, resync) and tells the router through its
engine-event methods (``PreciseIndexer``; a bare
:class:`~prefixroute.core.PrefixIndex` through ``IndexTarget``), keyed by our own hashes of
the token ids the events carry. The core never sees a socket, a frame or an engine hash.
``EventPublisher`` speaks the same protocol for emulated engines.
"""

from prefixroute.events._decode import decode_batch, read_batch
from prefixroute.events._endpoint import EventEndpoint
from prefixroute.events._errors import BadEndpoint, EventDecodeError, EventStreamError
from prefixroute.events._indexer import EngineBlocks, IndexerStats, IndexTarget, PreciseIndexer
from prefixroute.events._publisher import EventPublisher
from prefixroute.events._sequence import SeqOutcome, SequenceTracker
from prefixroute.events._subscriber import EventSubscriber, StreamState, StreamStats
from prefixroute.events._wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
    KVCacheEvent,
    KVEvent,
    KVEventBatch,
    encode_batch,
    pack_frames,
    unpack_frames,
)
from prefixroute.events._wire_other import encode_array_batch

__all__ = [
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BadEndpoint",
    "BlockRemoved",
    "BlockStored",
    "EngineBlocks",
    "EventBatch",
    "EventDecodeError",
    "EventEndpoint",
    "EventPublisher",
    "EventStreamError",
    "EventSubscriber",
    "ExternalBlockHash",
    "IndexTarget",
    "IndexerStats",
    "KVCacheEvent",
    "KVEvent",
    "KVEventBatch",
    "PreciseIndexer",
    "SeqOutcome",
    "SequenceTracker",
    "StreamState",
    "StreamStats",
    "decode_batch",
    "encode_array_batch",
    "encode_batch",
    "pack_frames",
    "read_batch",
    "unpack_frames",
]
