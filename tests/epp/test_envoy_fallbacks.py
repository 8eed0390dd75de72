"""Fallback endpoints through a real Envoy: what each kind of cluster does with the list.

* ``override_host`` (a static cluster of the pool's endpoints, a route retry policy): a dead
  primary is skipped for the picker's own next choice, on the second attempt, and the picker
  learns which endpoint served (Envoy's ``upstream.address`` attribute).
* ``ORIGINAL_DST`` reads the header as one address: a list is none, and Envoy answers 503. So
  the picker sends one endpoint unless told to send fallbacks.

The picker's probes are slowed (``STEADY``), so it still believes in the dead replica: only the
proxy's retry down the list saves those requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from gateway.helpers import FAST_GATEWAY, FAST_REPLICA, STEADY

from prefixroute.emulate import EmulatedCluster, start_replicas
from prefixroute.epp import EndpointPicker, EppConfig, endpoint_of

from .envoy import Envoy

pytestmark = pytest.mark.envoy
BODY = {"model": "emulated", "max_tokens": 2}
# Requests that take tens of milliseconds, so a crash finds some of them in flight.
SLOW_REPLICA = dataclasses.replace(FAST_REPLICA, time_scale=0.3)


@pytest.fixture
async def replicas() -> AsyncIterator[EmulatedCluster]:
    c = await start_replicas(4, FAST_REPLICA)
    yield c
    await c.stop()


async def run(
    envoy_path: str, tmp_path: Path, cluster: EmulatedCluster, fallbacks: int, override: bool
) -> tuple[EndpointPicker, Envoy, list[tuple[int, str]]]:
    """Round robin over 4 replicas, the first one dead: 8 requests through Envoy, one at a
    time; (status, the replica the picker's header names) of each."""
    routing = dataclasses.replace(
        FAST_GATEWAY, replicas=tuple(cluster.urls), policy="round_robin", **STEADY
    )
    epp = EndpointPicker(EppConfig(routing, grpc_port=0, http_port=0, fallbacks=fallbacks))
    await epp.start()
    pool = [endpoint_of(url) for url in cluster.urls] if override else None  # type: ignore[arg-type]
    envoy = Envoy(
        envoy_path, epp.grpc_port, tmp_path, "FULL_DUPLEX_STREAMED", pool=pool, trace=True
    )
    try:
        envoy.start()
        await cluster.replicas[0].stop()
        statuses = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            for i in range(8):
                body = {**BODY, "prompt": f"request {i}"}
                async with session.post(envoy.url + "/v1/completions", json=body) as resp:
                    await resp.read()
                    statuses.append((resp.status, resp.headers.get("x-prefixroute-replica", "")))
    finally:
        envoy.stop()
        await epp.stop(0)
    return epp, envoy, statuses


async def test_override_host_goes_down_the_pickers_list(
    envoy_path: str, tmp_path: Path, replicas: EmulatedCluster
) -> None:
    dead = endpoint_of(replicas.urls[0])  # type: ignore[arg-type]
    _, envoy, answers = await run(envoy_path, tmp_path, replicas, 1, override=True)
    assert [status for status, _ in answers] == [200] * 8
    log = envoy.accesses()
    assert len(log) == 8 and all(len(named) == 2 for named, *_ in log)
    rescued = [(named, served, attempts) for named, served, _, attempts in log if named[0] == dead]
    assert len(rescued) == 2  # round robin: every fourth request's primary was the dead one
    for named, served, attempts in rescued:
        assert (served, attempts) == (named[1], 2)  # the picker's fallback, second attempt
    for named, served, _, attempts in log:
        if named[0] != dead:
            assert (served, attempts) == (named[0], 1)
    # Envoy told the picker who served (upstream.address): the answer names the fallback.
    named_by_picker = [name for _, name in answers]
    assert named_by_picker == [f"http://{served}" for _, served, _, _ in log]


async def test_original_dst_cannot_read_a_list(
    envoy_path: str, tmp_path: Path, replicas: EmulatedCluster
) -> None:
    _, envoy, answers = await run(envoy_path, tmp_path, replicas, 1, override=False)
    assert [status for status, _ in answers] == [
        503
    ] * 8  # no address at all: Envoy's "no healthy upstream"
    assert all(served == "-" for _, served, _, _ in envoy.accesses())


async def test_a_replica_killed_under_load_loses_no_request(
    envoy_path: str, tmp_path: Path
) -> None:
    """Issue 13's target, through Envoy: 16 clients, 96 plain requests, one replica crashes
    (every connection reset) after 40. The requests it was serving, and those picked for it
    before its probes fail, go down the picker's list: every one is answered. With Envoy's
    default retry circuit breaker (3 at once) some of them were answered 503 (UO,UF)."""
    cluster = await start_replicas(4, SLOW_REPLICA)
    routing = dataclasses.replace(
        FAST_GATEWAY, replicas=tuple(cluster.urls), policy="least_loaded", **STEADY
    )
    epp = EndpointPicker(EppConfig(routing, grpc_port=0, http_port=0, fallbacks=3))
    pool = [endpoint_of(url) for url in cluster.urls]  # type: ignore[arg-type]
    envoy: Envoy | None = None
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(96):
        queue.put_nowait(i)
    statuses: list[int] = []

    async def client(session: aiohttp.ClientSession, envoy: Envoy) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            if i == 40:
                await cluster.replicas[0].kill()
            body = {**BODY, "prompt": f"{i} " + " ".join(f"w{j}" for j in range(200))}
            async with session.post(envoy.url + "/v1/completions", json=body) as resp:
                await resp.read()
                statuses.append(resp.status)

    try:
        await epp.start()
        envoy = Envoy(
            envoy_path, epp.grpc_port, tmp_path, "FULL_DUPLEX_STREAMED", pool=pool, trace=True
        )
        envoy.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            await asyncio.gather(*(client(session, envoy) for _ in range(16)))
    finally:
        if envoy is not None:
            envoy.stop()
        await epp.stop(0)
        await cluster.stop()
    failed = [line for line in envoy.access_log.read_text().splitlines() if " 200 " not in line]
    assert statuses == [200] * 96, failed  # named, served, status, attempts, Envoy's flags
    dead = endpoint_of(cluster.urls[0])  # type: ignore[arg-type]
    log = envoy.accesses()
    rescued = [a for a in log if a[0][0] == dead and a[1] != dead]
    assert rescued, ("no request had been picked for the killed replica", log)
    for named, served, status, attempts in rescued:
        assert served in named[1:] and attempts >= 2, (named, served, status, attempts)
