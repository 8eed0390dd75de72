"""Precise mode with several gateway instances: each subscribes to every engine's events.

The engines bind their PUB sockets and every gateway connects to all of them (ZMQ fans each
batch out to every subscriber), so three instances hold the same index without talking to each
other. A conversation whose turns reach different instances stays on its replica, and every
instance predicts exactly the cached tokens the replica then reports.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import redis.asyncio as aioredis
from polling import until

from prefixroute.core import ReplicaId
from prefixroute.emulate import EmulatedTokenizer
from prefixroute.gateway import Gateway

from .helpers import STEADY, ClusterFactory, GatewayFactory, Reply, reset_until_live, send
from .redis_server import RedisServer
from .test_precise import BS, batches, heard_conversation, metric, metrics, replica_config
from .test_sync import all_connected

INSTANCES = 3


async def precise_fleet(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    instances: int = INSTANCES,
    **settings: Any,
) -> list[Gateway]:
    config = replica_config(kv_events="bind:tcp://127.0.0.1:*")
    replicas = (await make_cluster(3, config)).replicas
    specs = tuple(f"{r.url}=connect:{r.kv_events_address}" for r in replicas)
    settings = {"speculative_ttl_s": 0.001} | settings
    gws = [
        await make_gateway(
            [r.url for r in replicas],
            kv_events=specs,
            kv_block_size=BS,
            seed=i,
            tokenizer_object=EmulatedTokenizer(),
            **STEADY,
            **settings,
        )  # fmt: skip
        for i in range(instances)
    ]
    await reset_until_live(
        session, (r.url for r in replicas), lambda rid: [gw.event_streams[rid] for gw in gws]
    )
    return gws


async def test_three_instances_follow_the_same_events(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    gws = await precise_fleet(make_cluster, make_gateway, session)
    replies, messages = await heard_conversation(session, gws)  # round robin over the instances
    assert len({r.headers["x-prefixroute-replica"] for r in replies}) == 1
    cached = [r.usage["prompt_tokens_details"]["cached_tokens"] for r in replies if r.usage]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    predicted = [int(r.headers["x-prefixroute-predicted-cached-tokens"]) for r in replies]
    assert predicted == cached  # whichever instance routed the turn
    # The same next turn asked of each instance: the same replica and the same prediction,
    # equal to what the replica reports.
    messages.append({"role": "user", "content": "and then?"})
    body = {"model": "emulated", "messages": messages, "max_tokens": 4}
    again: list[Reply] = []
    for i, gw in enumerate(gws):
        before = [batches(g) for g in gws]
        reply = await send(session, gw.url, "/v1/chat/completions", body)
        assert reply.complete and reply.usage is not None, reply
        again.append(reply)
        for g, b in zip(gws, before, strict=True):  # the first stores the new blocks; the
            if i == 0:  # repeats store nothing new, so they publish nothing
                await until(lambda g=g, b=b: batches(g) > b)
    assert {r.headers["x-prefixroute-replica"] for r in again} == {
        replies[0].headers["x-prefixroute-replica"]
    }
    for reply in again:
        assert reply.usage is not None
        reported = reply.usage["prompt_tokens_details"]["cached_tokens"]
        assert int(reply.headers["x-prefixroute-predicted-cached-tokens"]) == reported > 0
    # The three indexes agree: same entries per replica, and each one's match is the same.
    index_sizes = {tuple(gw.router.index.blocks_of(r) for r in gw.router.replicas) for gw in gws}
    assert len(index_sizes) == 1
    for gw in gws:
        text = await metrics(session, gw.url)
        assert metric(text, "prefixroute_kv_event_gaps_total") == 0


async def test_with_redis_the_others_decisions_are_speculative_entries_and_load(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    """Events take a moment: until they come, a decision made at one instance stands in for
    them at the others too (a speculative entry), and its request counts in their load."""
    gws = await precise_fleet(
        make_cluster, make_gateway, session, 2, sync_redis=redis_server.url, speculative_ttl_s=30
    )
    await all_connected(session, gws, up=True)
    first, other = gws
    assert other.router.speculative is not None
    words = " ".join(f"s{i}" for i in range(200))
    body = {"model": "emulated", "messages": [{"role": "user", "content": words}],
            "max_tokens": 4}  # fmt: skip
    reply = await send(session, first.url, "/v1/chat/completions", body)
    assert reply.complete, reply
    replica = ReplicaId(reply.headers["x-prefixroute-replica"])
    speculative = other.router.speculative
    await until(lambda: speculative.blocks_of(replica) > 0)  # only the sync puts them there
    assert all(speculative.blocks_of(r) == 0 for r in other.router.replicas if r != replica)
    await until(lambda: other.router.loads.get(replica).completed == 1)  # counted, then ended
    load = other.router.loads.get(replica)
    assert (load.in_flight, load.prefilling) == (0, 0)
    text = await metrics(session, other.url)
    assert metric(text, "prefixroute_sync_applied_total") == 1
    assert metric(text, "prefixroute_sync_remote_in_flight") == 0
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        assert await client.llen("prefixroute:routed:history") == 0  # precise: no history
    finally:
        await client.aclose()
