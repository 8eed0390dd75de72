"""Failures nobody can judge, and retries that show nothing (gateway/_verdict.py's docstring).

From the docstring: a request that could go to no other replica (here: the only replica serving
its model) is judged by nothing but a refused connection, since request content can cause every
other failure; a retry answered "busy" shows nothing, so it convicts no one. An outside audit
(2026-12-07) took replicas out with three such requests each: prompts slow enough to pass the
first-byte deadline on the only replica that could serve them, and poison answered 500 on the
first replica and "busy" on the second.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from prefixroute.gateway import Gateway

from .fakes import FakeReplica, completion_body, one_event_stream
from .helpers import FakeFactory, GatewayFactory
from .test_answer_edge_cases import _error_event

SOLO = "solo"  # a model one replica serves alone


async def _solo(request: web.Request) -> web.StreamResponse:
    """Slow past the first-byte deadline on SLOW, 502 on POISON, a dropped connection on DROP,
    an in-band 500 on INBAND; else a one-event stream."""
    body = await request.read()
    if b"INBAND" in body:
        return await _error_event(request)
    if b"SLOW" in body:
        await asyncio.sleep(1.0)
    if b"POISON" in body:
        return web.json_response({"error": {"message": "engine failed"}}, status=502)
    if b"DROP" in body and request.transport is not None:
        request.transport.close()
        await asyncio.sleep(0.1)
    return await one_event_stream(request)


@pytest.fixture
async def solo(
    make_fake: FakeFactory, make_gateway: GatewayFactory
) -> tuple[FakeReplica, Gateway]:
    """A replica serving SOLO alone beside one serving the default model, and a gateway with a
    short first-byte deadline (0.3 s)."""
    other = await make_fake()
    alone = await make_fake(handler=_solo, models=(SOLO,))
    gw = await make_gateway([other.url, alone.url], first_byte_floor_s=0.3, first_byte_cap_s=0.3)
    return alone, gw


async def _chat(session: aiohttp.ClientSession, gw: Gateway, text: str) -> int:
    body = {"model": SOLO, "messages": [{"role": "user", "content": text}], "stream": True}
    async with session.post(gw.url + "/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


@pytest.mark.parametrize("poison", ["SLOW", "POISON", "DROP", "INBAND"])
async def test_a_request_that_can_go_nowhere_else_marks_no_replica(
    solo: tuple[FakeReplica, Gateway], session: aiohttp.ClientSession, poison: str
) -> None:
    """Nor does it count in the replica's error rate; its failures are still counted by kind."""
    alone, gw = solo
    record = gw.registry.find(alone.url)
    for i in range(5):
        status = await _chat(session, gw, f"{poison} {i}")
        assert status >= 500 or poison == "INBAND"  # (an in-band error comes in a 200)
    assert record.total_failures == 0 and not record.outcomes
    kind = {"SLOW": "timeout", "POISON": "status", "DROP": "disconnect", "INBAND": "error_event"}
    metrics = await (await session.get(gw.url + "/metrics")).text()
    counted = f'prefixroute_upstream_failures_total{{kind="{kind[poison]}",replica="{alone.url}"}}'
    assert f"{counted} 5.0" in metrics
    assert await _chat(session, gw, "canary") == 200


async def test_a_refused_connection_still_marks_the_only_replica(
    solo: tuple[FakeReplica, Gateway], session: aiohttp.ClientSession
) -> None:
    alone, gw = solo
    record = gw.registry.find(alone.url)
    await alone.stop()
    assert await _chat(session, gw, "anyone there?") >= 500
    assert record.total_failures >= 1


async def _poison_else_ok(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if b"POISON" in body:
        return web.json_response({"error": {"message": "engine crashed"}}, status=500)
    return web.Response(body=completion_body(), content_type="application/json")


async def _full(request: web.Request) -> web.StreamResponse:
    return web.json_response({"object": "error", "message": "busy", "code": 429}, status=429)


async def test_a_retry_answered_busy_convicts_no_one(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """The only replica with room fails a poison request (500); its retry goes to a full one
    (429): that shows nothing about the first, which stays unmarked."""
    works = await make_fake(handler=_poison_else_ok)
    full = await make_fake(handler=_full)
    gw = await make_gateway([works.url, full.url], policy="round_robin", health_interval_s=60)
    for i in range(6):
        body = {"prompt": f"POISON {i}", "max_tokens": 1}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            await resp.read()
    assert gw.registry.find(works.url).total_failures == 0


@pytest.mark.parametrize(
    ("retry", "convicted"),
    [
        ({}, True),  # the retry was served: the first replica failed where another did not
        ({"client_gone": True}, False),  # its client left: it showed nothing
        ({"client_gone": True, "cut": "slow_client"}, False),
        ({"busy": True}, False),  # told "busy": nothing either
    ],
)
def test_only_a_retry_that_was_served_convicts_the_first_replica(
    retry: dict[str, object], convicted: bool
) -> None:
    from prefixroute.core import ReplicaId, Router, make_policy
    from prefixroute.gateway import GatewayConfig, ReplicaRegistry
    from prefixroute.gateway._metrics import GatewayMetrics
    from prefixroute.gateway._relay import RelayResult
    from prefixroute.gateway._verdict import Verdict

    a, b = ReplicaId("http://a:1"), ReplicaId("http://b:2")
    router = Router(make_policy("round_robin"))
    registry = ReplicaRegistry(router, GatewayConfig())
    registry.add(a)
    registry.add(b)
    verdict = Verdict(registry, GatewayMetrics(router, registry))
    assert not verdict.failed(a, "timeout", can_retry=True)
    verdict.answered(b, RelayResult(web.Response(), 200, None, **retry))  # type: ignore[arg-type]
    assert registry.get(a).total_failures == (1 if convicted else 0)
    assert registry.get(b).total_failures == 0
