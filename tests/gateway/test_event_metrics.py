"""Precise mode's stream metrics (gateway/_event_metrics.py): what the outside audit of
2026-12-06 could not see in /metrics, a failed replay, a stream caught up at its first batch,
blocks brought back from before a clear, a clear after the publisher reconnected, and the age
of the last batch (a dead publisher says nothing on a SUB socket)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client.registry import CollectorRegistry

from prefixroute.core import BlockHasher, PrefixIndex, ReplicaId
from prefixroute.events import (
    BlockStored,
    EventEndpoint,
    EventSubscriber,
    KVEventBatch,
    PreciseIndexer,
    encode_batch,
    pack_frames,
)
from prefixroute.gateway._event_metrics import EventCollector

R = ReplicaId("http://r:1")


def frames(seq: int, tokens: list[int], parent: int | None, hashes: list[int]) -> list[bytes]:
    event = BlockStored(hashes, parent, tokens, 4, None, "GPU", None)
    return list(pack_frames(b"", seq, encode_batch(KVEventBatch(0.0, [event]))))


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"replica": R, **labels})


async def test_the_streams_recoveries_and_the_last_batch_age_are_exported() -> None:
    context = zmq.asyncio.Context()
    index = PrefixIndex()
    index.add_replica(R)
    indexer = PreciseIndexer(R, index, BlockHasher(4))
    silent = context.socket(zmq.ROUTER)  # a replay endpoint that never answers
    silent.bind("tcp://127.0.0.1:*")
    replay = silent.getsockopt(zmq.LAST_ENDPOINT).decode()  # type: ignore[union-attr]
    sub = EventSubscriber(
        EventEndpoint("tcp://127.0.0.1:1", False, replay), indexer, context, replay_timeout_s=0.05
    )
    precise: Any = SimpleNamespace(
        router=SimpleNamespace(speculative_entries=lambda: None), subscribers={R: sub}
    )
    registry = CollectorRegistry()
    registry.register(EventCollector(precise))
    try:
        assert sample(registry, "prefixroute_kv_event_last_batch_age_seconds") is None
        await sub.receive(frames(0, list(range(8)), None, [1, 2]))
        await sub.receive(frames(2, list(range(8, 12)), 2, [3]))  # a gap the replay leaves open
    finally:
        silent.close(linger=0)
        context.term()
    assert sample(registry, "prefixroute_kv_event_replay_failures_total") == 1
    assert sample(registry, "prefixroute_kv_event_resyncs_total", cause="gap") == 1
    assert sample(registry, "prefixroute_kv_event_resyncs_total", cause="reconnect") == 0
    assert sample(registry, "prefixroute_kv_event_blocks_total", kind="recalled") == 2
    assert sample(registry, "prefixroute_kv_event_caught_up_total") == 0
    age = sample(registry, "prefixroute_kv_event_last_batch_age_seconds")
    assert age is not None and 0 <= age < 5
