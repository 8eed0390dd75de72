"""What real vLLM says of its size: each replica's prefix index grown to its KV cache
(gateway/_index_size.py), and its batch size (gateway/_server_info.py). vLLM says its cache's
size in the labels of ``vllm:cache_config_info``, and the gateway's index for it keeps that many
tokens' worth of blocks where ``index_capacity_blocks`` is less."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixroute.core import index_blocks_for
from prefixroute.gateway import Gateway, GatewayConfig

from .engines import BLOCK_SIZE, MAX_NUM_SEQS, MODEL_NAME, VLLMServer

pytestmark = pytest.mark.vllm


async def engine_kv_tokens(session: aiohttp.ClientSession, engine: VLLMServer) -> int:
    """num_gpu_blocks x block_size, as vLLM's own metrics page labels them."""
    async with session.get(engine.url + "/metrics") as resp:
        page = await resp.text()
    (info,) = [
        s for f in text_string_to_metric_families(page) for s in f.samples
        if s.name == "vllm:cache_config_info"
    ]  # fmt: skip
    assert info.labels["block_size"] == str(BLOCK_SIZE)
    return int(info.labels["num_gpu_blocks"]) * BLOCK_SIZE


async def test_the_index_keeps_what_the_engines_kv_cache_holds(
    engines: list[VLLMServer],
) -> None:
    config = GatewayConfig(
        port=0, replicas=tuple(e.url for e in engines), kv_block_size=BLOCK_SIZE,
        health_interval_s=0.2, read_timeout_s=120.0, index_capacity_blocks=100,
    )  # fmt: skip
    async with (
        Gateway(config) as gw,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        for engine in engines:
            kv_tokens = await engine_kv_tokens(session, engine)
            # VLLM_CPU_KVCACHE_SPACE=1 (GiB) in engines.py: 262,144 tokens of this model's.
            assert 100_000 < kv_tokens < 1_000_000, kv_tokens
            rid = gw.registry.find(engine.url).id
            per_token = gw.router.chars_per_token_of(MODEL_NAME)  # the prior: nothing learned
            want = index_blocks_for(kv_tokens, config.block_chars, per_token)
            async with asyncio.timeout(10):
                while gw.router.index_size(rid) != want:
                    await asyncio.sleep(0.05)
            assert want > 100  # grown from the configured size


async def test_the_router_knows_the_batch_size_vllm_states_in_development_mode(
    engines: list[VLLMServer],
) -> None:
    """vLLM says its ``max_num_seqs`` only on its development-mode ``/server_info`` (the engines
    here run in that mode): the gateway reads it when each engine joins (gateway/_server_info.py),
    so the slot term has it before any batch filled."""
    config = GatewayConfig(
        port=0, replicas=tuple(e.url for e in engines), health_interval_s=0.2,
        read_timeout_s=120.0,
    )  # fmt: skip
    async with Gateway(config) as gw:
        for engine in engines:
            rid = gw.registry.find(engine.url).id
            async with asyncio.timeout(10):
                while gw.router.replica_load(rid).slots.size is None:
                    await asyncio.sleep(0.05)
            assert gw.router.replica_load(rid).slots.size == MAX_NUM_SEQS
