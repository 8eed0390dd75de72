"""A replica whose engine lost its KV cache (a crash, a restart) must not keep its place in the
prefix index: in approximate mode nothing else tells the index, and requests would go on being
sent there for prefixes it no longer holds. Two signs clear it (``gateway._health``): a probe
whose connection is refused, and a scrape whose prefill counters went down or vanished."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from prefixroute.gateway import Gateway
from prefixroute.gateway._state import STATE

from .fakes import one_event_stream
from .helpers import GatewayFactory, counter, metrics_page, send, words

# vLLM's prefill histograms (as tests/data/metrics/vllm_prefill.prom), at two points of a life.
PAGE = """# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{{model_name="m"}} {seconds}
vllm:request_prefill_time_seconds_count{{model_name="m"}} {count}
# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_sum{{model_name="m"}} {tokens}
vllm:request_prefill_kv_computed_tokens_count{{model_name="m"}} {count}
"""
OLD = PAGE.format(seconds=9.0, count=40, tokens=90_000)
RESTARTED = PAGE.format(seconds=0.2, count=1, tokens=500)


@dataclass
class Engine:
    """What the test server's /metrics shows."""

    page: str = OLD


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def _serving(port: int, engine: Engine) -> AsyncIterator[str]:
    """A replica on ``port``: /health, /metrics from ``engine``, one event for any POST."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/metrics":
            return web.Response(text=engine.page)
        if request.method == "POST":
            return await one_event_stream(request)
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _held(gw: Gateway, url: str) -> Callable[[], int]:
    rid = gw.registry.find(url).id
    return lambda: gw.router.index.blocks_of(rid)


async def _check(gw: Gateway) -> None:
    """One health round, now (the background one runs every 50 ms as well)."""
    health = gw.app[STATE].health
    assert health is not None
    await health.check_all()


@asynccontextmanager
async def _routed(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> AsyncIterator[tuple[Engine, Gateway, str, Callable[[], int]]]:
    """A replica whose first counters are the gateway's baseline, then one prompt routed to
    it: (its engine's page, the gateway, its URL, the blocks the index holds for it)."""
    engine = Engine()
    async with _serving(_free_port(), engine) as url:
        gw = await make_gateway([url])
        await _check(gw)  # the counters' baseline
        await _route_to(session, gw, words(300))
        yield engine, gw, url, _held(gw, url)


async def _route_to(session: aiohttp.ClientSession, gw: Gateway, prompt: str) -> None:
    body = {"prompt": prompt, "max_tokens": 1, "stream": True}
    reply = await send(session, gw.url, "/v1/completions", body)
    assert reply.status == 200, reply


async def test_a_replica_that_refuses_connections_loses_its_place_in_the_index(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    port = _free_port()
    engine = Engine()
    async with _serving(port, engine) as url:
        gw = await make_gateway([url])
        held = _held(gw, url)
        await _route_to(session, gw, words(300))
        assert held() > 0
    await _check(gw)  # nothing listens on the port now: the process, and its cache, are gone
    assert held() == 0


# A fresh SGLang: its prefill series appear at its first request, so a restart leaves none
# (a labelled histogram is exported once first used); its running count is there.
SGLANG_FRESH = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified"} 0.0
"""


@pytest.mark.parametrize("restarted", [RESTARTED, SGLANG_FRESH], ids=["vllm", "sglang"])
async def test_a_restart_between_probes_is_seen_in_the_counters(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, restarted: str
) -> None:
    async with _routed(make_gateway, session) as (engine, gw, url, held):
        await _check(gw)
        assert held() > 0  # the same life: nothing is cleared
        assert await _losses(session, gw, url) == 0
        engine.page = restarted
        await _check(gw)
        assert held() == 0
        assert await _losses(session, gw, url) == 1  # in /metrics and the admin listing
        await _check(gw)
        assert await _losses(session, gw, url) == 1  # once: the page is still without them


async def test_a_page_that_says_nothing_of_the_engine_is_no_restart(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """A proxy's error page or text that is not Prometheus's (answered 200) has no prefill
    counters either: it is no sign of a restart, and the next good page is the same life."""
    async with _routed(make_gateway, session) as (engine, gw, url, held):
        for page in ("<html><body>502 Bad Gateway</body></html>", "not { prometheus"):
            engine.page = page
            await _check(gw)
        engine.page = OLD
        await _check(gw)
        assert held() > 0 and await _losses(session, gw, url) == 0


async def _losses(session: aiohttp.ClientSession, gw: Gateway, url: str) -> float:
    """Times ``url``'s cache was taken as lost, as /metrics says; the admin listing agrees."""
    total = counter(await metrics_page(session, gw), "prefixroute_replica_cache_lost_total")
    assert gw.registry.describe(gw.registry.find(url))["cache_losses"] == total
    return total


async def test_a_replica_down_for_many_rounds_is_cleared_and_logged_once(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()
    async with _serving(port, Engine()) as url:
        gw = await make_gateway([url], health_interval_s=3600.0)  # rounds: the test's
        held = _held(gw, url)
        await _route_to(session, gw, words(300))
    with caplog.at_level(logging.WARNING, logger="prefixroute.gateway._health"):
        for _ in range(3):
            await _check(gw)
    assert held() == 0
    lost = [r for r in caplog.records if "taken as lost" in r.getMessage()]
    assert len(lost) == 1 and "refused connections" in lost[0].getMessage()
    assert gw.registry.describe(gw.registry.find(url))["cache_losses"] == 1  # counted once
