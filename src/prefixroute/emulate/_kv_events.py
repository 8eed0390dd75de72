"""The emulated engine's KV events: the replica model's cache changes, published as vLLM does.

After each step the bridge drains what the model recorded (``ReplicaModel(record_events=True)``)
and publishes one ``KVEventBatch``: the evictions first (they happened when the step admitted its
requests), then the stored blocks, grouped into one ``BlockStored`` per run of blocks that
continue each other (one request's new blocks, as vLLM groups them per request). A step that
changed nothing publishes nothing, as vLLM skips empty batches. A prefix-cache reset publishes
``AllBlocksCleared``.

Block hashes on the wire are the model's own 64-bit ints (vLLM sends ints as well); the gateway
does not depend on them matching its own hashes, only on the token ids.
"""

from __future__ import annotations

from prefixroute.events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisher,
    KVEvent,
)
from prefixroute.sim.replica import ReplicaModel, StoredBlock


class KVEventBridge:
    def __init__(self, model: ReplicaModel, publisher: EventPublisher) -> None:
        self.model = model
        self.publisher = publisher

    def flush(self) -> None:
        """Publish the cache changes since the last flush (none: nothing is sent)."""
        stored = self.model.take_stored_blocks()
        _, removed = self.model.take_cache_events()
        events: list[KVEvent] = []
        if removed:
            events.append(BlockRemoved(block_hashes=list(removed), medium=MEDIUM_GPU))
        events += _stored_events(stored, self.model.config.block_size)
        if events:
            self.publisher.publish(events)

    def cleared(self) -> None:
        """The model's prefix cache was reset."""
        self.flush()
        self.publisher.publish([AllBlocksCleared()])


def _stored_events(blocks: list[StoredBlock], block_size: int) -> list[KVEvent]:
    events: list[KVEvent] = []
    run: list[StoredBlock] = []
    for block in blocks:
        if run and block.parent != run[-1].block_hash:
            events.append(_stored(run, block_size))
            run = []
        run.append(block)
    if run:
        events.append(_stored(run, block_size))
    return events


def _stored(run: list[StoredBlock], block_size: int) -> BlockStored:
    return BlockStored(
        block_hashes=[b.block_hash for b in run],
        parent_block_hash=run[0].parent,
        token_ids=[t for b in run for t in b.tokens],
        block_size=block_size,
        lora_id=None,
        medium=MEDIUM_GPU,
        lora_name=None,
        extra_keys=[None] * len(run),
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
