"""Concurrency through a real Envoy on the bootstrap the picker ships.

Every request in flight holds one ext_proc stream to the picker (it reads the answer too) and one
connection to the pool, for the whole generation. Envoy's circuit breakers default to 1,024 of
each per cluster, so on a bootstrap without its own limits the 1,025th concurrent request was
answered 500 with an empty body (76 of 1,100 here, on 2026-12-01). The bootstrap sets every
cluster's limits to ``EnvoyConfig.max_requests`` (65,536).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import aiohttp
import pytest
from gateway.helpers import FAST_REPLICA

from .conftest import StackFactory

pytestmark = pytest.mark.envoy
CONCURRENT = 1_100  # above Envoy's default 1,024


async def test_more_requests_in_flight_than_envoy_s_default_limits(
    make_stack: StackFactory,
) -> None:
    # Real-time replicas: a 40-token answer takes long enough that all of them overlap.
    stack = await make_stack("least_loaded", n=2, replica=dataclasses.replace(FAST_REPLICA,
                             time_scale=1.0))  # fmt: skip
    sent: list[float] = []
    done: list[float] = []

    async def one(session: aiohttp.ClientSession, i: int) -> int:
        body = {"model": "emulated", "max_tokens": 40, "prompt": f"{i} hello"}
        sent.append(time.monotonic())
        async with session.post(stack.url + "/v1/completions", json=body) as resp:
            await resp.read()
        done.append(time.monotonic())
        return resp.status

    connector = aiohttp.TCPConnector(limit=0)  # one connection each, all at once
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        statuses = await asyncio.gather(*(one(session, i) for i in range(CONCURRENT)))
    assert statuses.count(200) == CONCURRENT, {s: statuses.count(s) for s in set(statuses)}
    # They did overlap: more than Envoy's default had been sent before the first one ended.
    assert sum(t < min(done) for t in sent) > 1_024
