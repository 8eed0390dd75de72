from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prefixroute.emulate import EmulatedCluster, EmulatorConfig, start_replicas
from prefixroute.gateway import Gateway

from .helpers import FAST_GATEWAY, FAST_REPLICA, ClusterFactory, GatewayFactory
from .redis_server import RedisServer


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        yield s


@pytest.fixture
async def make_cluster() -> AsyncIterator[ClusterFactory]:
    clusters: list[EmulatedCluster] = []

    async def make(n: int, config: EmulatorConfig = FAST_REPLICA) -> EmulatedCluster:
        cluster = await start_replicas(n, config)
        clusters.append(cluster)
        return cluster

    yield make
    for c in clusters:
        await c.stop()


@pytest.fixture
async def make_gateway() -> AsyncIterator[GatewayFactory]:
    gateways: list[Gateway] = []

    async def make(replicas: list[str], **settings: Any) -> Gateway:
        tokenizer = settings.pop("tokenizer_object", None)
        config = dataclasses.replace(FAST_GATEWAY, replicas=tuple(replicas), **settings)
        gw = Gateway(config, tokenizer=tokenizer)
        await gw.start()
        gateways.append(gw)
        return gw

    yield make
    for gw in gateways:
        await gw.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()
