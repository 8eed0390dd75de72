"""The emulated engine's KV events: the replica model's cache changes, published as vLLM does.

After each step the bridge drains what the model recorded (``ReplicaModel(record_events=True)``)
and publishes one ``KVEventBatch``: the evictions first (they happened when the step admitted its
requests), then the stored blocks, grouped into one ``BlockStored`` per run of blocks that
continue each other (one request's new blocks, as vLLM groups them per request). A step that
changed nothing publishes nothing, as vLLM skips empty batches. A prefix-cache reset publishes
``AllBlocksCleared``.

Block hashes on the wire are the model's own 64-bit ints (vLLM sends ints as well); the gateway
does not depend on them matching its own hashes, only on the token ids.

A LoRA adapter's blocks carry what vLLM's carry: ``lora_name``, the deprecated ``lora_id`` (here
the adapter's position in the configured list, from 1) and the name as each block's extra key.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    def __init__(
        self, model: ReplicaModel, publisher: EventPublisher, adapters: Sequence[str] = ()
    ) -> None:
        self.model = model
        self.publisher = publisher
        self.adapter_ids = {name: i for i, name in enumerate(adapters, start=1)}

    def flush(self) -> None:
        """Publish the cache changes since the last flush (none: nothing is sent)."""
        stored = self.model.take_stored_blocks()
        _, removed = self.model.take_cache_events()
        events: list[KVEvent] = []
        if removed:
            events.append(BlockRemoved(block_hashes=list(removed), medium=MEDIUM_GPU))
        events += _stored_events(stored, self.model.config.block_size, self.adapter_ids)
        if events:
            self.publisher.publish(events)

    def cleared(self) -> None:
        """The model's prefix cache was reset."""
        self.flush()
        self.publisher.publish([AllBlocksCleared()])


def _stored_events(
    blocks: list[StoredBlock], block_size: int, adapter_ids: dict[str, int]
) -> list[KVEvent]:
    events: list[KVEvent] = []
    run: list[StoredBlock] = []
    for block in blocks:
        last = run[-1] if run else None
        if last is not None and (
            block.parent != last.block_hash or block.lora_name != last.lora_name
        ):
            events.append(_stored(run, block_size, adapter_ids))
            run = []
        run.append(block)
    if run:
        events.append(_stored(run, block_size, adapter_ids))
    return events


def _stored(run: list[StoredBlock], block_size: int, adapter_ids: dict[str, int]) -> BlockStored:
    lora = run[0].lora_name
    return BlockStored(
        block_hashes=[b.block_hash for b in run],
        parent_block_hash=run[0].parent,
        token_ids=[t for b in run for t in b.tokens],
        block_size=block_size,
        lora_id=adapter_ids.get(lora) if lora is not None else None,
        medium=MEDIUM_GPU,
        lora_name=lora,
        extra_keys=[(lora,) if lora is not None else None] * len(run),
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
