"""A replica that turned a request away computed none of it, so the router's index must not say
it holds the prompt (``Router.withdraw``): otherwise the prefix's next requests are sent there,
predicted cheap, to be computed in full. Turned away: a 429 (full), any 4xx (refused), a refused
connection (never reached)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from prefixroute.gateway import Gateway
from prefixroute.gateway._state import STATE

from .fakes import FakeReplica, one_event_stream, queue_full
from .helpers import STEADY, FakeFactory, GatewayFactory


async def _too_long(request: web.Request) -> web.StreamResponse:
    """vLLM's answer to a prompt longer than its context."""
    body = {"object": "error", "message": "This model's maximum context length is 2048 tokens.",
            "type": "BadRequestError", "param": None, "code": 400}  # fmt: skip
    return web.json_response(body, status=400)


def indexed(gw: Gateway, fake: FakeReplica) -> int:
    """Blocks the router's index says ``fake`` holds."""
    return gw.app[STATE].router.indexed_blocks(gw.registry.find(fake.url).id)


def withdrawn(gw: Gateway) -> float:
    registry = gw.app[STATE].metrics.registry
    return sum(
        s.value for m in registry.collect() for s in m.samples
        if s.name == "prefixroute_prefix_index_withdrawn_blocks_total"
    )  # fmt: skip


async def _send(session: aiohttp.ClientSession, gw: Gateway, i: int) -> int:
    body = {"prompt": f"question {i} " + "word " * 100, "max_tokens": 1, "stream": True}
    async with session.post(gw.url + "/v1/completions", json=body) as resp:
        await resp.read()
        return resp.status


async def test_a_full_replica_is_not_indexed_with_what_it_turned_away(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    full = await make_fake(handler=queue_full)
    free = await make_fake(handler=one_event_stream)
    gw = await make_gateway([full.url, free.url], policy="round_robin")  # each tried in turn
    assert [await _send(session, gw, i) for i in range(8)] == [200] * 8
    assert len([s for s in full.seen if s.method == "POST"]) >= 1  # it was asked, and refused
    assert indexed(gw, full) == 0
    assert indexed(gw, free) > 0  # the one that served them holds them
    assert withdrawn(gw) > 0


async def test_a_refusal_the_client_gets_leaves_no_blocks_either(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    full = await make_fake(handler=queue_full)
    refusing = await make_fake(handler=_too_long)
    gw1 = await make_gateway([full.url], **STEADY)  # nowhere else: the 429 is the client's
    gw2 = await make_gateway([refusing.url], **STEADY)
    assert await _send(session, gw1, 0) == 429 and await _send(session, gw2, 0) == 400
    assert indexed(gw1, full) == 0 and indexed(gw2, refusing) == 0


async def test_a_replica_that_could_not_be_reached_is_not_indexed_with_the_request(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    gone = await make_fake(handler=one_event_stream)
    free = await make_fake(handler=one_event_stream)
    # No probe between the replica's end and the request: the request finds it gone.
    gw = await make_gateway([gone.url, free.url], policy="round_robin", health_interval_s=60.0)
    await gone.stop()
    statuses = [await _send(session, gw, i) for i in range(2)]
    assert statuses == [200, 200]  # the one sent to the dead replica was retried on the other
    assert indexed(gw, gone) == 0
    assert indexed(gw, free) > 0


async def test_a_replica_that_failed_keeps_what_it_may_have_computed(
    make_fake: FakeFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A 5xx may come after the prefill (the engine failed later): its blocks stay, for the
    next answer's usage to judge."""

    async def broken(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "engine failed"}}, status=500)

    failing = await make_fake(handler=broken)
    gw = await make_gateway([failing.url], **STEADY)  # nowhere to retry: the 500 is relayed
    assert await _send(session, gw, 0) == 500
    assert indexed(gw, failing) > 0 and withdrawn(gw) == 0
