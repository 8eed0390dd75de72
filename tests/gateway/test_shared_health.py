"""``/health`` says how the state an instance shares stands: the Redis sync and the KV-event
streams (docs/deployment.md, "the state shared with others"), without changing its status; the
admin listing gives each replica's stream state.

Before, an operator saw neither anywhere but in /metrics: a gateway whose sync had never
connected, or whose every stream was resyncing, answered /health exactly as a healthy one."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from polling import until
from prometheus_client import CollectorRegistry

from prefixroute.core import Router, make_policy
from prefixroute.emulate import EmulatedTokenizer
from prefixroute.gateway import Gateway
from prefixroute.sync import RouteSync

from .helpers import ClusterFactory, GatewayFactory, GatewayOf, send
from .redis_server import RedisServer
from .test_admin import AUTH, TOKEN
from .test_precise import free_port, precise_cluster
from .test_sync import all_connected, fleet


async def health(session: aiohttp.ClientSession, gw: Gateway) -> tuple[int, dict[str, Any]]:
    async with session.get(gw.url + "/health") as resp:
        return resp.status, await resp.json()


async def test_without_sync_or_events_health_names_neither(
    gateway_of: GatewayOf, session: aiohttp.ClientSession
) -> None:
    status, body = await health(session, await gateway_of(1))
    assert status == 200
    assert "sync" not in body and "kv_events" not in body


async def test_health_says_the_sync_is_up_and_which_others_it_hears(
    make_cluster: ClusterFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
    redis_server: RedisServer,
) -> None:
    gws = await fleet(make_cluster, make_gateway, redis_server.url)
    await all_connected(session, gws, up=True)
    body = {"model": "emulated", "prompt": "a question for the first instance", "max_tokens": 2}
    assert (await send(session, gws[0].url, "/v1/completions", body)).complete

    async def hears_the_first() -> bool:  # its decision, first token and end reach the others
        said = [(await health(session, g))[1]["sync"]["instances"] for g in gws[1:]]
        return all(n >= 1 for n in said)

    await until(hears_the_first)
    status, said = await health(session, gws[1])
    assert status == 200 and said["sync"]["connected"] is True
    assert said["sync"]["instances"] == 1  # the first instance; itself is not counted


async def test_a_sync_that_cannot_connect_shows_and_the_gateway_stays_up(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, sync_redis="redis://127.0.0.1:1")  # nobody there
    status, body = await health(session, gw)
    assert status == 200  # routes on its own view
    assert body["sync"] == {"connected": False, "instances": 0}


async def test_health_counts_the_streams_in_each_state_and_the_listing_names_each(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    replicas, gw = await precise_cluster(
        make_cluster, make_gateway, session, 2, False, admin_token=TOKEN
    )
    status, body = await health(session, gw)
    assert status == 200
    assert body["kv_events"] == {"waiting": 0, "live": 2, "resyncing": 0}
    async with session.get(gw.url + "/admin/replicas", headers=AUTH) as resp:
        listed = (await resp.json())["replicas"]
    assert {r["url"]: r["kv_events"] for r in listed} == {r.url: "live" for r in replicas}


async def test_a_stream_nobody_publishes_on_is_waiting_and_a_replica_without_one_has_none(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(2)
    quiet, bare = cluster.urls
    gw = await make_gateway(
        cluster.urls, kv_events=(f"{quiet}=bind:tcp://127.0.0.1:{free_port()}",),
        kv_block_size=16, tokenizer_object=EmulatedTokenizer(), admin_token=TOKEN,
    )  # fmt: skip
    assert (await health(session, gw))[1]["kv_events"] == {"waiting": 1, "live": 0, "resyncing": 0}
    async with session.get(gw.url + "/admin/replicas", headers=AUTH) as resp:
        listed = (await resp.json())["replicas"]
    assert {r["url"]: r["kv_events"] for r in listed} == {quiet: "waiting", bare: None}


def test_an_instance_counts_as_heard_until_it_has_been_silent_for_silent_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import prefixroute.sync._remote as remote_module
    from prefixroute.sync._remote import SILENT_S
    from prefixroute.sync._wire import encode_progress

    clock = [1000.0]
    monkeypatch.setattr(remote_module.time, "monotonic", lambda: clock[0])
    sync = RouteSync("redis://127.0.0.1:9/0", "c", Router(make_policy("round_robin")),
                     CollectorRegistry(), instance_id="me")  # fmt: skip
    sync.remote.apply(encode_progress("me", "", False))  # our own, heard back: not another
    sync.remote.apply(encode_progress("other", "", False))
    assert sync.status() == {"connected": False, "instances": 1}
    clock[0] += SILENT_S
    assert sync.status()["instances"] == 1  # silent exactly that long: still there
    clock[0] += 0.001
    assert sync.status()["instances"] == 0
