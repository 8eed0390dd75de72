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
    BlockRemoved,
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
        router=SimpleNamespace(speculative_entries=lambda: None), subscribers={R: sub}, retired={}
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


async def test_a_replica_removed_and_added_again_continues_its_counters() -> None:
    """docs/gateway.md: a removed replica's counters stay until the process ends, and a
    replica added again at the same URL continues them. Its stream's counters were read from
    its live subscriber only, so they vanished at removal and began at 0 when it came back."""
    from prefixroute.core import Router, make_policy
    from prefixroute.events import IndexerStats, StreamState, StreamStats
    from prefixroute.gateway._precise import PreciseMode

    def stream(batches: int, stored: int) -> Any:
        async def stop() -> None:
            return None

        stats, ix = StreamStats(batches=batches), IndexerStats(stored_blocks=stored)
        return SimpleNamespace(stats=stats, indexer=SimpleNamespace(stats=ix),
                               state=StreamState.LIVE, stop=stop)  # fmt: skip

    router = Router(make_policy("round_robin"), insert_on_route=False)
    precise = PreciseMode(router, {})
    registry = CollectorRegistry()
    registry.register(EventCollector(precise))
    precise.subscribers[R] = stream(3, 24)
    assert sample(registry, "prefixroute_kv_event_batches_total") == 3
    precise.removed(R)  # the admin API removes it: its stream stops
    assert sample(registry, "prefixroute_kv_event_batches_total") == 3  # stays
    assert sample(registry, "prefixroute_kv_event_blocks_total", kind="stored") == 24
    live = "prefixroute_kv_event_stream_state"
    assert sample(registry, live, state="live") is None  # its gauges went with it
    precise.subscribers[R] = stream(1, 8)  # added again at the same URL
    assert sample(registry, "prefixroute_kv_event_batches_total") == 4  # continued
    assert sample(registry, "prefixroute_kv_event_blocks_total", kind="stored") == 32
    assert sample(registry, live, state="live") == 1.0


async def test_blocks_of_another_size_and_unknown_removals_have_their_own_series() -> None:
    """An engine whose block size is not the gateway's was counted only as ``skipped`` (which
    also counts salted, multimodal and CPU-tier blocks), and removals of blocks never heard of
    only in the indexer (an outside audit, 2026-12-07)."""
    context = zmq.asyncio.Context()
    index = PrefixIndex()
    index.add_replica(R)
    sub = EventSubscriber(
        EventEndpoint("tcp://127.0.0.1:1", False), PreciseIndexer(R, index, BlockHasher(4)),
        context,
    )  # fmt: skip
    precise: Any = SimpleNamespace(
        router=SimpleNamespace(speculative_entries=lambda: None), subscribers={R: sub}, retired={}
    )
    registry = CollectorRegistry()
    registry.register(EventCollector(precise))
    eight = BlockStored([1, 2], None, list(range(16)), 8, None, "GPU", None)  # 8-token blocks
    gone = BlockRemoved([77, 78, 79], "GPU")
    try:
        await sub.receive(list(pack_frames(b"", 0, encode_batch(KVEventBatch(0.0, [eight, gone])))))
    finally:
        context.term()
    assert sample(registry, "prefixroute_kv_event_blocks_total", kind="wrong_size") == 2
    assert sample(registry, "prefixroute_kv_event_blocks_total", kind="skipped") == 2
    assert sample(registry, "prefixroute_kv_event_blocks_total", kind="unknown_removed") == 3
