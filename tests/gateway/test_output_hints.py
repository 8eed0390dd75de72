"""Output lengths and choice counts are load-view hints, bounded (``core/request_key.py``):
a client's ``max_tokens`` of 2**64 or 10**400 once broke the float costs of ``kv_cost`` for
every request in flight beside it, the sync wire's int64 (leaving the request counted in
flight forever) and the load's token sums (a traceback per request)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from prefixroute.core import Endpoint, key_of
from prefixroute.core.request_key import MAX_CHOICES_HINT, MAX_OUTPUT_HINT
from prefixroute.gateway._state import STATE

from .fakes import FakeReplica, held_until
from .helpers import STEADY, ClusterFactory, GatewayFactory

HUGE = [2**64, 10**400]


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_huge_output_length_is_read_at_the_bound(field: str, value: int) -> None:
    key = key_of(Endpoint.CHAT, {"messages": [{"role": "user", "content": "hi"}], field: value})
    assert key.max_tokens == MAX_OUTPUT_HINT
    assert key_of(Endpoint.COMPLETIONS, {"prompt": "hi", "n": value}).choices == MAX_CHOICES_HINT
    assert key_of(Endpoint.COMPLETIONS, {"prompt": "hi", "max_tokens": 7}).max_tokens == 7


async def test_a_huge_hint_in_flight_leaves_the_others_served(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """kv_cost scores every candidate's active blocks as floats: one request holding
    10**400 output tokens made every other request a 500 while it ran."""
    release = asyncio.Event()
    fakes = [FakeReplica(held_until(release)) for _ in range(2)]  # a choice to score
    for fake in fakes:
        await fake.start()
    try:
        gw = await make_gateway([f.url for f in fakes], policy="kv_cost", **STEADY)
        huge = {"model": "emulated", "prompt": [1, 2, 3], "max_completion_tokens": 10**400}
        held = asyncio.ensure_future(session.post(gw.url + "/v1/completions", json=huge))
        await asyncio.sleep(0.2)  # routed, and held by the replica
        other = {"model": "emulated", "prompt": [4, 5, 6], "max_tokens": 1}
        release_soon = asyncio.get_running_loop().call_later(0.2, release.set)
        async with session.post(gw.url + "/v1/completions", json=other) as resp:
            assert resp.status == 200, await resp.text()
        release_soon.cancel()
        release.set()
        assert (await held).status == 200
    finally:
        release.set()
        for fake in fakes:
            await fake.stop()


async def test_a_huge_hint_that_the_replica_refuses_logs_no_traceback(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    body = {"model": "emulated", "prompt": [1, 2, 3], "max_tokens": 10**309}
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            async with session.post(gw.url + "/v1/completions", json=body) as resp:
                assert resp.status == 400  # the replica's own refusal, relayed
        await asyncio.sleep(0.1)  # the ends, a loop turn after the answers
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    load = gw.router.replica_load(gw.registry.find(cluster.urls[0]).id)
    assert load.in_flight == 0


class _BrokenListener:
    """A route listener (the Redis sync) whose every call fails."""

    def routed(self, view: object, decision: object) -> None:
        raise OverflowError("can't serialize")

    def completed(self, rid: str) -> None:
        pass

    def withdrawn(self, rid: str) -> None:
        pass


async def test_a_listener_that_fails_loses_no_request_and_leaks_no_slot(
    make_cluster: ClusterFactory, make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    """Once routed, a request is counted in flight: a failing listener (the sync's encoding)
    must neither fail it nor keep it counted (1,024 such requests had filled every replica's
    in-flight cap: 503 for everyone after)."""
    cluster = await make_cluster(1)
    gw = await make_gateway(cluster.urls, **STEADY)
    proxy = gw.app[STATE].proxy
    assert proxy is not None
    proxy.listener = _BrokenListener()  # type: ignore[assignment]
    for _ in range(3):
        body = {"model": "emulated", "prompt": [1, 2, 3], "max_tokens": 1}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
    await asyncio.sleep(0.05)
    assert gw.router.replica_load(gw.registry.find(cluster.urls[0]).id).in_flight == 0
