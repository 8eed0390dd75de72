"""Replicas that die, hang or fail: every client gets a whole answer or a clear error, in time."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp

from prefixroute.emulate import start_replicas
from prefixroute.gateway import ReplicaStatus

from .fakes import FakeReplica, SilentReplica
from .helpers import FAST_REPLICA, ClusterFactory, GatewayFactory, Reply, send, words

# Slow enough that requests are still running when a replica dies (about 0.3 s each).
SLOW_REPLICA = dataclasses.replace(FAST_REPLICA, time_scale=0.5)


async def _wait_for(predicate: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)


async def test_replica_killed_during_a_run(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await make_cluster(3, SLOW_REPLICA)
    gw = await make_gateway(cluster.urls, policy="round_robin")
    victim = cluster.replicas[0]

    async def one(i: int) -> Reply:
        body = {"prompt": words(50 + i), "max_tokens": 20, "stream": i % 2 == 0}
        return await send(session, gw.url, "/v1/completions", body)

    async with asyncio.timeout(15):  # nothing may hang
        first = [asyncio.create_task(one(i)) for i in range(12)]
        await asyncio.sleep(0.1)  # requests are in flight everywhere
        await victim.kill()
        later = [asyncio.create_task(one(100 + i)) for i in range(12)]
        replies = await asyncio.gather(*first, *later)

    for r in replies:
        # A whole response, or a clear error: a JSON error status, or an error event + [DONE].
        assert r.complete or (r.error is not None and r.done), r
    # Plain requests in flight on the victim were retried before any byte was relayed; only
    # streams already under way can end in an error event.
    for i, r in enumerate(replies[:12]):
        if i % 2 == 1:
            assert r.complete, r
    # Requests sent after the kill never reach the dead replica for long: all complete.
    assert all(r.complete for r in replies[12:])
    assert all(r.headers["x-prefixroute-replica"] != victim.url for r in replies[12:])
    await _wait_for(lambda: gw.registry.find(victim.url).status is ReplicaStatus.UNHEALTHY)


async def test_stream_cut_after_first_byte_ends_with_error_event(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    cluster = await start_replicas(1, SLOW_REPLICA)
    try:
        gw = await make_gateway(cluster.urls)
        async with session.post(
            gw.url + "/v1/completions",
            json={"prompt": words(10), "max_tokens": 200, "stream": True},
        ) as resp:
            assert resp.status == 200
            first = await resp.content.readuntil(b"\n\n")
            assert first.startswith(b"data: {")
            await cluster.replicas[0].kill()
            async with asyncio.timeout(5):
                rest = await resp.content.read()
    finally:
        await cluster.stop()
    assert b'"error"' in rest
    assert rest.endswith(b"data: [DONE]\n\n")


async def test_silent_replica_times_out_and_is_retried(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    silent = SilentReplica()
    await silent.start()
    try:
        cluster = await make_cluster(1)
        gw = await make_gateway(
            [silent.url, *cluster.urls], policy="round_robin", read_timeout_s=0.3
        )
        async with asyncio.timeout(10):
            replies = [
                await send(session, gw.url, "/v1/completions", {"prompt": "a b c", "stream": s})
                for s in (False, True, False, True)
            ]
        assert all(r.complete for r in replies), replies
        assert {r.headers["x-prefixroute-replica"] for r in replies} == {cluster.urls[0]}
        async with session.get(gw.url + "/metrics") as resp:
            metrics = await resp.text()
        assert 'prefixroute_retries_total{reason="timeout"}' in metrics
    finally:
        await silent.stop()


async def test_silent_only_replica_gives_504(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    silent = SilentReplica()
    await silent.start()
    try:
        # Enough failures allowed that the replica is still "healthy" for the second request.
        gw = await make_gateway([silent.url], read_timeout_s=0.3, failure_threshold=10)
        async with asyncio.timeout(10):
            plain = await send(session, gw.url, "/v1/completions", {"prompt": "a b"})
            stream = await send(session, gw.url, "/v1/completions", {"prompt": "a", "stream": True})
        for r in (plain, stream):
            assert r.status == 504
            assert r.error is not None and r.error["code"] == "upstream_timeout"
    finally:
        await silent.stop()


async def test_failing_replica_is_ejected_then_readmitted(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    flaky = FakeReplica()
    await flaky.start()
    try:
        cluster = await make_cluster(1)
        gw = await make_gateway([flaky.url, *cluster.urls], policy="round_robin")
        flaky.failing = True
        # Requests landing on the failing replica are retried on the good one.
        for _ in range(6):
            r = await send(session, gw.url, "/v1/completions", {"prompt": "x y z"})
            assert r.complete, r
            assert r.headers["x-prefixroute-replica"] == cluster.urls[0]
        record = gw.registry.find(flaky.url)
        await _wait_for(lambda: record.status is ReplicaStatus.UNHEALTHY)
        flaky.failing = False
        await _wait_for(lambda: record.status is ReplicaStatus.HEALTHY)
        served = {
            (await send(session, gw.url, "/v1/completions", {"prompt": "x"})).headers[
                "x-prefixroute-replica"
            ]
            for _ in range(4)
        }
        assert flaky.url in served
    finally:
        await flaky.stop()


async def test_all_failing_relays_the_last_5xx(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    flaky = FakeReplica()
    await flaky.start()
    try:
        gw = await make_gateway([flaky.url])
        flaky.failing = True
        r = await send(session, gw.url, "/v1/completions", {"prompt": "x"})
        assert r.status == 500  # one candidate: nothing to retry on, the answer is relayed
        assert r.error == {"message": "boom"}
    finally:
        await flaky.stop()


async def test_client_disconnect_aborts_upstream(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory
) -> None:
    cluster = await make_cluster(1, SLOW_REPLICA)
    gw = await make_gateway(cluster.urls)
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            gw.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 500, "stream": True}
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()  # the client goes away mid-stream
    loads = gw.router.loads

    async def running() -> float:
        async with aiohttp.ClientSession() as s, s.get(cluster.urls[0] + "/metrics") as r:
            text = await r.text()
        line = next(x for x in text.splitlines() if x.startswith("vllm:num_requests_running"))
        return float(line.split(" ")[1])

    async with asyncio.timeout(5):
        while await running() != 0 or loads.get(gw.registry.find(cluster.urls[0]).id).in_flight:
            await asyncio.sleep(0.02)
