"""Replicas that die, hang or fail: every client gets a whole answer or a clear error, in time."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import aiohttp
from aiohttp import web

from prefixroute.emulate import start_replicas
from prefixroute.gateway import ReplicaStatus

from .fakes import SilentReplica
from .helpers import FAST_REPLICA, ClusterFactory, FakeFactory, GatewayFactory, Reply, send, words
from .test_precise import metric

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
    make_cluster: ClusterFactory,
    make_fake: FakeFactory,
    make_gateway: GatewayFactory,
    session: aiohttp.ClientSession,
) -> None:
    flaky = await make_fake()
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


async def test_all_failing_relays_the_last_5xx(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    flaky = await make_fake()
    gw = await make_gateway([flaky.url])
    flaky.failing = True
    r = await send(session, gw.url, "/v1/completions", {"prompt": "x"})
    assert r.status == 500  # one candidate: nothing to retry on, the answer is relayed
    assert r.error == {"message": "boom"}


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


# --- the retry loop (gateway/_proxy.py: retried once among the remaining candidates) ----------


async def test_no_healthy_replica_is_a_503(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    fake = await make_fake()
    gw = await make_gateway([fake.url], health_interval_s=60)
    record = gw.registry.find(fake.url)
    record.healthy = False
    record.out_until = float("inf")
    reply = await send(session, gw.url, "/v1/completions", {"prompt": "x"})
    assert reply.status == 503
    assert reply.error is not None and reply.error["code"] == "no_replica_available"
    assert [s for s in fake.seen if s.path.startswith("/v1/")] == []


async def test_with_nowhere_left_to_retry_the_client_gets_the_upstream_failure(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # Two replicas, one request in flight each at most. The first request fails with a 503
    # while the other replica has just filled up: the retry finds no candidate, and the client
    # hears about the upstream failure (502), not about the full replica.
    busy, release = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        prompt = json.loads(await request.read())["prompt"]
        if prompt == "fails":
            await busy.wait()  # the other replica is full now
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        busy.set()
        await release.wait()
        return web.json_response({"choices": [{"text": "ok"}]})

    fakes = [await make_fake(handler=handler), await make_fake(handler=handler)]
    try:
        gw = await make_gateway(
            [f.url for f in fakes], max_in_flight_per_replica=1, health_interval_s=60
        )
        first = asyncio.create_task(send(session, gw.url, "/v1/completions", {"prompt": "fails"}))
        await asyncio.sleep(0.2)  # routed: its replica is full from now on
        second = asyncio.create_task(send(session, gw.url, "/v1/completions", {"prompt": "held"}))
        reply = await asyncio.wait_for(first, 10)
        release.set()
        assert (await asyncio.wait_for(second, 10)).status == 200
        assert reply.status == 502
        assert reply.error is not None and reply.error["code"] == "bad_gateway"
    finally:
        release.set()


async def test_a_retried_request_makes_one_decision_per_attempt(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    # prefixroute_decision_seconds: the time to hash and decide, in seconds; the prompt is hashed
    # once, so its time counts into the first decision only. Two decisions of a short prompt
    # take far less than a second together.
    failing, good = await make_fake(failing=True), await make_fake()
    gw = await make_gateway([failing.url, good.url], policy="round_robin", health_interval_s=60)
    record = gw.registry.find(failing.url)
    record.healthy, record.failures = True, 0  # it failed its first probe; let it in
    for i in range(2):  # round robin: one of the two starts on the failing replica
        reply = await send(session, gw.url, "/v1/completions", {"prompt": f"p{i}"})
        assert reply.status == 200
    async with session.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    assert metric(text, "prefixroute_decision_seconds_count") == 3
    assert 0 <= metric(text, "prefixroute_decision_seconds_sum") < 1.0
    assert metric(text, "prefixroute_retries_total", reason="status") == 1
