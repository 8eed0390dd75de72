"""Stored Responses API answers behind several gateway instances (``--sync-redis``): each
instance publishes the replica of every Responses answer it relays, and applies the others',
so a conversation continued by id at any instance goes where its response is stored; one that
starts later learns the recent ones from the history (gateway/_responses.py, sync/_redis.py)."""

from __future__ import annotations

import json

import aiohttp
from polling import until
from prometheus_client.registry import CollectorRegistry

from prefixroute.core import ReplicaId, Router, make_policy
from prefixroute.gateway import Gateway
from prefixroute.sync._redis import RouteSync
from prefixroute.sync._wire import Stored, decode, encode_stored

from .helpers import STEADY, ClusterFactory, GatewayFactory, post_json, words
from .redis_server import RedisServer
from .test_sync import all_connected

REPLICA = "x-prefixroute-replica"


async def known(session: aiohttp.ClientSession, gw: Gateway, response_id: str) -> bool:
    async with session.get(gw.url + f"/v1/responses/{response_id}") as resp:
        return resp.status == 200


async def test_a_conversation_continued_at_other_instances_stays_where_it_is_stored(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    cluster = await make_cluster(4)
    urls = [r.url for r in cluster.replicas]
    gws = [await make_gateway(urls, seed=i, policy="round_robin", sync_redis=redis_server.url,
                              **STEADY) for i in range(2)]  # fmt: skip
    await all_connected(session, gws, up=True)
    for conversation in range(4):
        body: dict[str, object] = {"input": f"{conversation}: " + words(60), "max_output_tokens": 1}
        for turn in range(4):
            gw = gws[turn % 2]  # a round-robin balancer in front of the instances
            status, headers, raw = await post_json(session, gw.url + "/v1/responses", body)
            assert status == 200, raw
            if turn == 0:
                home = headers[REPLICA]
            assert headers[REPLICA] == home
            previous = json.loads(raw)["id"]
            # The next instance has heard of it (in production: the user's think time).
            await until(lambda g=gws[(turn + 1) % 2], p=previous: known(session, g, p))
            body = {"input": f"and {turn}?", "previous_response_id": previous,
                    "max_output_tokens": 1}  # fmt: skip
    # An instance started later knows the recent ones from the history.
    later = await make_gateway(urls, seed=9, sync_redis=redis_server.url, **STEADY)
    await all_connected(session, [later], up=True)
    assert await known(session, later, previous)


def test_stored_messages_reach_the_front_ends_map_and_ours_are_not_applied() -> None:
    router = Router(make_policy("round_robin"))
    sync = RouteSync("redis://127.0.0.1:9/0", "c", router, CollectorRegistry(), instance_id="me")
    heard: list[tuple[str | None, str, ReplicaId]] = []
    sync.on_stored = lambda *args: heard.append(args)
    payload = encode_stored("other", "team-a", "resp_1", ReplicaId("http://r:1"))
    assert decode(payload) == Stored("other", "team-a", "resp_1", "http://r:1")
    sync.remote.apply(payload)
    sync.remote.apply(payload, live=False)  # replayed from the history: as well
    sync.remote.apply(encode_stored("me", None, "resp_2", ReplicaId("http://r:1")))
    assert heard == [("team-a", "resp_1", "http://r:1")] * 2
