"""LoRA adapters behind the gateway: a prefix cached under one model never counts for another.

vLLM serves each LoRA adapter as a model name, lists it in ``/v1/models`` with its base model as
``parent``, and hashes the adapter's name into every block, so the same prompt under two
adapters (or an adapter and the base model) shares no cache. The emulated replica does the same
(``EmulatorConfig.adapters``); the gateway learns which names are adapters from ``/v1/models``
and keys their requests apart, in approximate mode (its own index) and in precise mode (the
engine's ``BlockStored`` events, which name the adapter in ``lora_name``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from polling import until

from prefixroute.core import ReplicaId
from prefixroute.emulate import EmulatedTokenizer, EmulatorConfig
from prefixroute.events import StreamState
from prefixroute.gateway import Gateway
from prefixroute.gateway._health import HealthChecker
from prefixroute.sim.replica import ReplicaConfig

from .helpers import STEADY, ClusterFactory, FakeFactory, GatewayFactory, send, words
from .test_precise import batches

BS = 16  # the replica's KV block size, tokens
MODELS = ("base", "sql", "chat")  # the base model and two adapters of it


def replica_config(**kw: Any) -> EmulatorConfig:
    engine = ReplicaConfig(block_size=BS, kv_capacity_blocks=4096)
    return EmulatorConfig(engine, model="base", adapters=MODELS[1:], time_scale=0.01, **kw)


async def gateway(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    precise: bool,
) -> Gateway:
    """One replica serving the base model and two adapters, behind a gateway that knows the
    adapters (and, in precise mode, follows the replica's events, speculative entries off)."""
    if precise:
        cluster = await make_cluster(1, replica_config(kv_events="bind:tcp://127.0.0.1:*"))
        replica = cluster.replicas[0]
        gw = await make_gateway(
            cluster.urls,
            kv_events=(f"{replica.url}=connect:{replica.kv_events_address}",),
            kv_block_size=BS,
            tokenizer_object=EmulatedTokenizer(),
            speculative_ttl_s=0.001,
            **STEADY,
        )
        stream = gw.event_streams[ReplicaId(replica.url)]
        while stream.state is not StreamState.LIVE:  # connected and in step
            async with session.post(replica.url + "/reset_prefix_cache") as resp:
                assert (await resp.json())["success"]
            await asyncio.sleep(0.01)
    else:
        cluster = await make_cluster(1, replica_config())
        gw = await make_gateway(cluster.urls, **STEADY)
    await until(lambda: gw.registry.adapter_of("sql") == "sql")  # /v1/models was read
    assert gw.registry.adapter_of("base") is None
    return gw


@pytest.mark.parametrize("precise", [False, True], ids=["approximate", "precise"])
async def test_the_same_prompt_under_two_models_shares_no_predicted_cache(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    precise: bool,
) -> None:
    gw = await gateway(make_cluster, make_gateway, session, precise)
    prompt = words(400)

    async def ask(model: str, stores: bool) -> tuple[int, int]:
        """(predicted, reported) cached tokens of the prompt under ``model``; ``stores``: it
        caches new blocks, whose events precise mode then waits for."""
        before = batches(gw)
        body = {"model": model, "prompt": prompt, "max_tokens": 2}
        reply = await send(session, gw.url, "/v1/completions", body)
        assert reply.complete, reply
        if precise and stores:
            await until(lambda: batches(gw) > before)  # the engine reported what it stored
        predicted = int(reply.headers["x-prefixroute-predicted-cached-tokens"])
        assert reply.usage is not None
        return predicted, int(reply.usage["prompt_tokens_details"]["cached_tokens"])

    for model in MODELS:  # each model's first sight of the prompt: nothing cached for it
        assert await ask(model, stores=True) == (0, 0), model
    for model in MODELS:  # its second: a hit, under its own key only
        predicted, reported = await ask(model, stores=False)
        assert reported > 0 and predicted > 0, model
        if precise:
            assert predicted == reported, model  # the events say exactly what it holds
    if precise:
        stats = next(iter(gw.event_streams.values())).indexer.stats
        assert stats.adapter_blocks > 0 and stats.skipped_blocks == 0


async def test_an_adapter_loaded_at_runtime_becomes_routable_and_an_unloaded_one_goes(
    make_fake: FakeFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM and SGLang load LoRA adapters while they run (``/v1/load_lora_adapter``): a healthy
    replica's model list is asked again every ``models_refresh_s``, so a new adapter's requests
    are served and an unloaded one's are a 404 again, without the replica leaving rotation."""
    monkeypatch.setattr(HealthChecker, "models_refresh_s", 0.1)
    fake = await make_fake(models=("base",))
    gw = await make_gateway([fake.url])

    async def status(model: str) -> int:
        body = {"model": model, "prompt": "hello", "max_tokens": 1}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            return resp.status

    assert await status("base") == 200
    assert await status("sql") == 404  # not served (yet)
    fake.models = ("base", "sql")  # the adapter is loaded
    async with asyncio.timeout(5):
        while await status("sql") != 200:
            await asyncio.sleep(0.05)
    fake.models = ("base",)  # and unloaded
    async with asyncio.timeout(5):
        while await status("sql") != 404:
            await asyncio.sleep(0.05)
    assert gw.registry.find(fake.url).healthy
