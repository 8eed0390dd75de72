"""The emulated replica's KV events: vLLM's wire format, read back by our own subscriber."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import aiohttp
import pytest
import zmq.asyncio
from polling import until

from prefixroute.commands.emulate import add_parser, config_from_args
from prefixroute.core import BlockHasher, PrefixIndex, ReplicaId
from prefixroute.emulate import EmulatedCluster, EmulatedReplica, EmulatorConfig, tokenize
from prefixroute.events import (
    EventEndpoint,
    EventSubscriber,
    PreciseIndexer,
    StreamState,
)
from prefixroute.sim.replica import ReplicaConfig

BS = 4
R = ReplicaId("emulated")
CONFIG = EmulatorConfig(
    ReplicaConfig(block_size=BS, kv_capacity_blocks=64),
    time_scale=0.01,
    kv_events="bind:tcp://127.0.0.1:*,replay=tcp://127.0.0.1:*",
    hash_seed=12345,  # the engine's hashes differ from the subscriber's: only tokens count
    adapters=("lora-a",),
)


@pytest.fixture
async def stream() -> AsyncIterator[tuple[EmulatedReplica, EventSubscriber, aiohttp.ClientSession]]:
    context = zmq.asyncio.Context()
    replica = EmulatedReplica(CONFIG)
    await replica.start()
    index = PrefixIndex()
    index.add_replica(R)
    assert replica.kv_events_address is not None
    endpoint = EventEndpoint(replica.kv_events_address, False, replica.kv_events_replay_address)
    sub = EventSubscriber(endpoint, PreciseIndexer(R, index, BlockHasher(BS)), context)
    await sub.start()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    # Reset until an AllBlocksCleared gets through: then the stream is connected and in step.
    while sub.state is not StreamState.LIVE:
        async with session.post(replica.url + "/reset_prefix_cache") as resp:
            assert (await resp.json()) == {"success": True}
        await asyncio.sleep(0.01)
    yield replica, sub, session
    await session.close()
    await sub.stop()
    await replica.stop()
    context.term()


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> int:
    body = {"prompt": prompt, "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=body) as resp:
        usage = (await resp.json())["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


async def test_stored_blocks_carry_the_prompt_tokens(
    stream: tuple[EmulatedReplica, EventSubscriber, aiohttp.ClientSession],
) -> None:
    replica, sub, session = stream
    prompt = " ".join(f"w{i}" for i in range(30))  # 30 tokens: 7 full blocks
    assert await complete(session, replica.url, prompt) == 0
    index = sub.indexer.index
    await until(lambda: index.blocks_of(R) == 7)
    hashes = BlockHasher(BS).hash_tokens(tokenize(prompt))
    assert index.match(hashes) == {R: 7}
    # The index predicted what the replica then reports.
    assert await complete(session, replica.url, prompt + " more") == 7 * BS
    assert sub.indexer.stats.orphan_blocks == 0 and sub.stats.gaps == 0


async def test_an_adapters_blocks_are_published_under_its_name(
    stream: tuple[EmulatedReplica, EventSubscriber, aiohttp.ClientSession],
) -> None:
    """As vLLM's: ``lora_name`` and the name as each block's extra key, so the subscriber
    indexes them in the adapter's key space, apart from the base model's same tokens."""
    replica, sub, session = stream
    prompt = " ".join(f"w{i}" for i in range(30))  # 7 full blocks
    body = {"model": "lora-a", "prompt": prompt, "max_tokens": 2}
    async with session.post(replica.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
    index = sub.indexer.index
    await until(lambda: index.blocks_of(R) == 7)
    tokens = tokenize(prompt)
    assert index.match(BlockHasher(BS).for_adapter("lora-a").hash_tokens(tokens)) == {R: 7}
    assert index.match(BlockHasher(BS).hash_tokens(tokens)) == {}
    stats = sub.indexer.stats
    assert (stats.adapter_blocks, stats.skipped_blocks, stats.orphan_blocks) == (7, 0, 0)
    assert await complete(session, replica.url, prompt) == 0  # the base model: no hit


async def test_evictions_are_published(
    stream: tuple[EmulatedReplica, EventSubscriber, aiohttp.ClientSession],
) -> None:
    replica, sub, session = stream
    for n in range(8):  # 8 x 40 tokens through a 64-block cache: the oldest are evicted
        await complete(session, replica.url, " ".join(f"p{n}x{i}" for i in range(40)))
    await until(lambda: sub.indexer.stats.removed_blocks > 0)
    assert sub.indexer.index.blocks_of(R) <= 64
    assert sub.indexer.stats.unknown_removals == 0


async def test_a_reset_publishes_all_blocks_cleared(
    stream: tuple[EmulatedReplica, EventSubscriber, aiohttp.ClientSession],
) -> None:
    replica, sub, session = stream
    await complete(session, replica.url, " ".join(f"w{i}" for i in range(12)))
    await until(lambda: sub.indexer.index.blocks_of(R) == 3)
    cleared = sub.indexer.stats.cleared_events
    async with session.post(replica.url + "/reset_prefix_cache") as resp:
        assert (await resp.json()) == {"success": True}
    await until(lambda: sub.indexer.stats.cleared_events == cleared + 1)
    assert sub.indexer.index.blocks_of(R) == 0


def test_the_command_line_flag_and_port_offsets() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["emulate", "--count", "3", "--kv-events-endpoint", "tcp://*:5600,replay=tcp://*:5700"]
    )
    config = config_from_args(args)
    assert config.kv_events_endpoint == EventEndpoint("tcp://*:5600", True, "tcp://*:5700")
    cluster = EmulatedCluster(3, dataclasses.replace(config, port=0))
    specs = [r.config.kv_events_endpoint for r in cluster.replicas]
    assert [s.address for s in specs if s] == ["tcp://*:5600", "tcp://*:5601", "tcp://*:5602"]
    assert [s.replay for s in specs if s] == ["tcp://*:5700", "tcp://*:5701", "tcp://*:5702"]
    assert not config.kv_events_positional  # vLLM's map form unless asked
    args = parser.parse_args(["emulate", "--kv-events-endpoint", "tcp://*:1", "--kv-events-form",
                              "array"])  # fmt: skip
    assert config_from_args(args).kv_events_positional
