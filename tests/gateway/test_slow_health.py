"""Health probes of replicas whose ``/health`` is slow (``gateway/_health.py``).

SGLang's ``/health`` (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``, on by default) submits a
one-token generation, sleeps a second and only then looks for its answer: it never answers in
under a second. At the old 1 s probe timeout every SGLang replica was taken out at registration
and every request was a 503 (the SGLang audit, 2026-12-07).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from prefixroute.gateway import GatewayConfig

from .fakes import completion_body, serve_every_path
from .helpers import GatewayFactory


class _Replica:
    """A replica whose ``/health`` takes ``health_s`` (None: never answers); counts probes."""

    def __init__(self, health_s: float | None) -> None:
        self.health_s = health_s
        self.probes: list[float] = []
        self.released = asyncio.Event()  # set at stop: a held probe ends
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self._runner, self.url = await serve_every_path(self._handle)

    async def stop(self) -> None:
        self.released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/health":
            self.probes.append(time.monotonic())
            if self.health_s is None:
                await self.released.wait()
            await asyncio.sleep(self.health_s or 0.0)
            return web.Response()
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "emulated", "object": "model"}]})
        if request.path == "/v1/completions":
            return web.Response(body=completion_body(), content_type="application/json")
        return web.json_response({"detail": "Not Found"}, status=404)


async def test_a_replica_whose_health_takes_a_second_is_healthy_by_default(
    make_gateway: GatewayFactory, session: aiohttp.ClientSession
) -> None:
    replica = _Replica(health_s=1.2)  # SGLang's: its sleep of one second, then the check
    await replica.start()
    try:
        default = GatewayConfig().health_timeout_s
        gw = await make_gateway([replica.url], health_timeout_s=default, health_interval_s=2.0)
        assert gw.registry.find(replica.url).healthy
        body = {"model": "emulated", "prompt": [1, 2, 3], "max_tokens": 1}
        async with session.post(gw.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
    finally:
        await replica.stop()


async def test_a_replica_that_holds_its_probes_does_not_hold_the_others(
    make_gateway: GatewayFactory,
) -> None:
    """A replica that accepts the probe and never answers is probed until the timeout (5 s);
    meanwhile the other replica's checks (and its scrapes) still come every interval."""
    hung, fine = _Replica(health_s=None), _Replica(health_s=0.0)
    for r in (hung, fine):
        await r.start()
    try:
        gw = await make_gateway([hung.url, fine.url], health_timeout_s=5.0,
                                health_interval_s=0.1)  # fmt: skip
        # (the first check of both, at start, waits for the hung one's timeout: 5 s)
        before = len(fine.probes)
        await asyncio.sleep(1.0)
        assert len(fine.probes) - before >= 5, len(fine.probes) - before  # about 10
        assert len(hung.probes) <= 2  # its one check at a time, not one per round
        assert not gw.registry.find(hung.url).healthy
    finally:
        for r in (hung, fine):
            await r.stop()
